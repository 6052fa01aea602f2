"""Terminal rendering: progress lines, facts and effects tables, the verdict panel."""

from __future__ import annotations

import re
import sys
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from flagtrial.facts import CAPACITY_LABELS
from flagtrial.redact import Redactor

# Types only: importing the trial and its engines at start costs every command a second.
if TYPE_CHECKING:
    from flagtrial.attribution.outcome import Attribution
    from flagtrial.engines.base import PhaseName, StartProgress
    from flagtrial.facts import Facts, FactsDiff, Limit, Rewrite
    from flagtrial.judge import Effect
    from flagtrial.records import Event, Generation, RunRow, TrialRow
    from flagtrial.session import Restore
    from flagtrial.targets.base import HostFacts
    from flagtrial.trial import TrialOutcome

# On a terminal, output follows its width; piped output is never wrapped (a width no
# line reaches), so diff lines and table cells reach the next tool whole.
UNWRAPPED = 100_000
console = Console(highlight=False, width=None if sys.stdout.isatty() else UNWRAPPED)
# soft_wrap: an error is one line, whatever the terminal width
err_console = Console(
    stderr=True,
    highlight=False,
    soft_wrap=True,
    width=None if sys.stderr.isatty() else UNWRAPPED,
)

COLOURS = {"KEEP": "green", "REVERT": "red", "INCONCLUSIVE": "yellow"}

# Everything this command prints passes through it; the command's ledger shares it, so the
# secret values of every spec the ledger holds are known here too.
secrets = Redactor()


def notify(state: str, detail: str) -> None:
    console.print(_progress(state, detail))


def notify_stderr(state: str, detail: str) -> None:
    """Progress for a command whose stdout holds only JSON."""
    err_console.print(_progress(state, detail))


def _progress(state: str, detail: str) -> str:
    stamp = time.strftime("%H:%M:%S")
    return f"[dim]{stamp}[/dim] [bold]{state:<18}[/bold] {secrets.text(detail)}"


# Escape sequences and control characters a server may log: a status line must stay one line.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x1f\x7f]")
# A phase line is for reading: the engine-config dump vLLM logs runs to thousands of characters.
PHASE_LINE_CHARS = 200


class RestartProgress:
    """A restart's progress as it runs (engines.base.StartProgress): on a terminal one live
    line (elapsed time, phase, the server's last log line) redrawn in place and cleared when
    the wait ends; elsewhere a line per phase entered, the ready line being the caller's."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self.live: Live | None = None
        self.spinner = Spinner("dots")
        self.shown: PhaseName = "starting"

    def __call__(self, p: StartProgress) -> None:
        # Redacted before it is cut or escaped: either could hide a secret from the patterns.
        line = _CONTROL.sub(" ", secrets.text(p.last_line)).strip()
        if self.out.is_terminal:
            self._draw(p, line)
        elif p.done:
            self.shown = "starting"
        elif p.phase not in (self.shown, "ready"):
            self.shown = p.phase
            cut = line if len(line) <= PHASE_LINE_CHARS else line[: PHASE_LINE_CHARS - 1] + "…"
            self.out.print(_progress(p.phase, "") + f"{p.elapsed_s:.1f}s  {escape(cut)}")

    def _draw(self, p: StartProgress, line: str) -> None:
        if p.done:
            if self.live is not None:
                self.live.stop()  # transient: the line goes
                self.live = None
            return
        row = Table.grid(padding=(0, 1))
        row.add_column()
        row.add_column(no_wrap=True, overflow="ellipsis")  # one line, whatever the log says
        row.add_row(
            self.spinner,
            Text.assemble(
                ("restarting ", "bold"), f"{p.elapsed_s:.1f}s  ", (p.phase, "bold cyan"), "  ",
                (line, "dim"),
            ),
        )  # fmt: skip
        if self.live is None:
            self.live = Live(row, console=self.out, transient=True, refresh_per_second=8)
            self.live.start()
        else:
            self.live.update(row)


def host_line(host: HostFacts, facts: Facts) -> str:
    gpus = (
        ", ".join(f"{g.name} (SM {g.compute_cap}, {g.memory_total})" for g in host.gpus)
        if host.gpus
        else "no GPU"
    )
    return (
        f"host {host.hostname}: {gpus}, {host.cpus} CPUs, kernel {host.kernel}; "
        f"{facts.engine} {facts.version or '(version unknown)'}"
    )


def facts_table(before: Facts, after: Facts | None = None, title: str = "facts") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("capacity")
    table.add_column("known-good", justify="right")
    if after is not None:
        table.add_column("candidate", justify="right")
        table.add_column("change", justify="right")
    table.add_column("source", style="dim")
    for key, value in before.capacity.items():
        row = [CAPACITY_LABELS.get(key, key), f"{value:g}"]
        if after is not None:
            later_value = after.capacity.get(key)
            row += (
                ["-", ""] if later_value is None else [f"{later_value:g}", _pct(value, later_value)]
            )
        table.add_row(*row, before.sources.get(key, ""))
    # Each limit on concurrent requests: what it admits (its own value); the least binds.
    limits = {limit.name: limit for limit in before.limits}
    later = {limit.name: limit for limit in after.limits} if after is not None else {}
    for name in [*limits, *(n for n in later if n not in limits)]:
        old, new = limits.get(name), later.get(name)
        row = [f"  limit {name}", _admits(old)]
        if after is not None:
            row += [_admits(new), _pct(old.admits, new.admits) if old and new else ""]
        table.add_row(*row, (old or new).source)  # type: ignore[union-attr]
    tokens = after.request_tokens if after is not None else None
    if tokens := tokens or before.request_tokens:
        table.caption = f"limits at {tokens:g} tokens per request (the workload's, as counted)"
    # Settings the server resolved to something other than what it was started with.
    rewrites = {r.name: r for r in before.rewrites}
    rewritten = {r.name: r for r in after.rewrites} if after is not None else {}
    for name in [*rewrites, *(n for n in rewritten if n not in rewrites)]:
        was, now = rewrites.get(name), rewritten.get(name)
        row = [f"  rewritten {name}", _rewrite(was)]
        if after is not None:
            row += [_rewrite(now), ""]
        # The server's own line, shown as printed (it may hold brackets).
        table.add_row(*row, Text((now or was).cause or ""))  # type: ignore[union-attr]
    return table


def _admits(limit: Limit | None) -> str:
    return "-" if limit is None else f"{limit.admits:g} ({limit.setting:g})"


def _rewrite(rewrite: Rewrite | None) -> str:
    return "-" if rewrite is None else f"{rewrite.got!r} (asked {rewrite.asked!r})"


def _pct(old: float, new: float) -> str:
    if old == 0:
        return ""
    pct = (new - old) / old * 100
    colour = "red" if pct < 0 else "green" if pct > 0 else "dim"
    return f"[{colour}]{pct:+.1f} %[/{colour}]"


def diff_lines(diff: FactsDiff) -> list[str]:
    return [f"implicit: {c.describe()}" for c in diff.implicit] + [
        f"named: {c.describe()}" for c in diff.explicit
    ]


def effects_table(effects: list[Effect]) -> Table:
    table = Table(
        title="measured effect (candidate vs known-good, geometric means of runs)",
        title_justify="left",
    )
    for col in ("metric", "c", "known-good", "candidate", "change", "interval", "runs"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for e in effects:
        table.add_row(
            e.label,
            str(e.concurrency),
            f"{e.baseline:.4g}",
            f"{e.candidate:.4g}",
            f"{e.pct:+.1f} %",
            f"{e.lo_pct:+.1f} .. {e.hi_pct:+.1f} %",
            f"{e.runs_baseline}+{e.runs_candidate}",
        )
    return table


def restore_line(restore: Restore) -> str:
    if restore.verified:
        caps = ", ".join(
            f"{CAPACITY_LABELS.get(k, k)} {v:g}" for k, v in restore.facts.capacity.items()
        )
        return f"[green]restored generation {restore.generation}, verified[/green]: {caps}"
    return f"[red]restored generation {restore.generation}, NOT verified[/red]: " + secrets.text(
        "; ".join(restore.mismatches)
    )


def show_outcome(outcome: TrialOutcome) -> None:
    v = outcome.verdict
    if outcome.facts_after is not None:
        console.print(facts_table(outcome.facts_before, outcome.facts_after))
    if outcome.diff is not None:
        for line in diff_lines(outcome.diff):
            console.print(f"  {secrets.text(line)}")
    if v.effects:
        console.print(effects_table(v.effects))
    body = "\n".join(f"- {secrets.text(r.message)}" for r in v.reasons)
    action = (
        f"generation {outcome.candidate_gen} kept as known-good"
        if outcome.outcome == "kept"
        else f"rolled back to generation {outcome.baseline_gen}"
    )
    if outcome.restore is not None:
        body += "\n" + restore_line(outcome.restore)
    colour = COLOURS[v.decision]
    console.print(
        Panel(
            body,
            title=f"[bold {colour}]{v.decision}[/] trial {outcome.trial_id}: {action}",
            border_style=colour,
            expand=False,
        )
    )


_OUTCOME_COLOURS = {"harmful": "red", "beneficial": "green", "useless": "yellow",
                    "interacting": "magenta", "unresolved": "white"}  # fmt: skip


def show_attribution(a: Attribution) -> None:
    """Per edit its outcome and evidence; what it cost against one edit at a time; the fixed
    change and the command that tries it."""
    table = Table(title=f"attribution of trial {a.trial_id}", title_justify="left")
    for col in ("edit", "", "outcome", "evidence"):
        table.add_column(col)
    for v in a.edits:
        colour = _OUTCOME_COLOURS[v.outcome]
        evidence = "\n".join(secrets.text(e) for e in v.evidence)
        shown = escape(secrets.text(v.shown()))
        table.add_row(str(v.index + 1), shown, f"[{colour}]{v.outcome}[/]", escape(evidence))
    console.print(table)
    used, naive = a.used, a.one_at_a_time
    console.print(
        f"spent {used.restarts} restarts and {used.load_s:g} s of load"
        + (f" ({a.resolutions} engine resolutions)" if a.resolutions else "")
        + f"; one edit at a time: {naive.restarts} restarts and {naive.load_s:g} s of load"
    )
    if a.stopped:
        console.print(f"[yellow]stopped early[/yellow]: {a.stopped}")
    fixed = a.fixed()
    if fixed is not None:
        console.print("fixed change (without the harmful and interacting edits):")
        for line in fixed.describe().splitlines():
            console.print(f"  {secrets.text(line)}", markup=False)
        console.print(f"try it: flagtrial trial --from-attribution {a.trial_id}")


def history_table(trials: list[TrialRow], generations: list[Generation]) -> Table:
    table = Table(title="trials", title_justify="left")
    # a ledger a fleet shares holds every host's trials: say whose each is
    hosts = len({t.target for t in trials}) > 1
    columns = ("trial", "started", *(("target",) if hosts else ()), "change", "gens", "state")
    for col in (*columns, "verdict", "first reason"):
        table.add_column(col)
    for t in trials:
        change = "; ".join(_edit(e) for e in t.change.get("edits", []))
        table.add_row(
            str(t.id),
            time.strftime("%F %T", time.localtime(t.started_at)),
            *((t.target,) if hosts else ()),
            change,
            f"{t.baseline_gen} -> {t.candidate_gen or '-'}",
            t.state + part_of(t),
            t.verdict or "-",
            (t.reasons[0].message if t.reasons else "")[:80],
        )
    return table


def part_of(t: TrialRow) -> str:
    """An attribution's own journal, or one of its probes: which trial it attributes."""
    if (of := t.record.get("attribution_of")) is not None:
        return f" (attribution of {of})"
    if (of := t.record.get("probe_of")) is not None:
        return f" (probe for {of})"
    return ""


def generations_table(generations: list[Generation], current: int | None) -> Table:
    table = Table(title="generations", title_justify="left")
    for col in ("gen", "created", "sha256", "known-good", "note"):
        table.add_column(col)
    for g in generations:
        mark = "yes" + (" (current)" if g.id == current else "") if g.known_good else ""
        table.add_row(
            str(g.id),
            time.strftime("%F %T", time.localtime(g.created_at)),
            g.spec_sha256[:12],
            mark,
            g.note,
        )
    return table


def _edit(edit: dict[str, str | None]) -> str:
    value = f" {edit['value']}" if edit.get("value") is not None else ""
    return f"{edit['op']} {edit['name']}{value}"


def timeline(events: list[Event]) -> Table:
    table = Table(title="timeline", title_justify="left")
    table.add_column("at")
    table.add_column("step")
    table.add_column("detail")
    for e in events:
        table.add_row(time.strftime("%T", time.localtime(e.at)), e.state, e.detail)
    return table


def runs_table(runs: list[RunRow]) -> Table:
    """Every run in the order measured: its restart block, arm, level, speed and the
    foreign load around it (with the reason when hygiene flagged it)."""
    table = Table(title="runs", title_justify="left")
    for name in ("#", "block", "arm", "c", "tok/s", "TTFT p99", "errors", "foreign CPU", "flag"):
        table.add_column(name, justify="left" if name in ("arm", "flag") else "right")
    for i, r in enumerate(runs, start=1):
        s = r.summary
        foreign = r.foreign
        table.add_row(
            str(i),
            str(r.block + 1),
            r.arm,
            str(r.concurrency),
            f"{s.get('output_tok_s') or 0:.1f}",
            f"{s['ttft_p99']:.3g}" if s.get("ttft_p99") is not None else "-",
            str(s.get("n_errors", 0)),
            f"{foreign['cpu_cores']:.2f}" if foreign else "-",
            r.disturbed or "",
        )
    return table
