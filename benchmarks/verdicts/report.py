"""Tables (results.md) and the plot (verdicts.png) from results.json and noise_fit.json.

Wrong verdict (the issue's definition): KEEP when the true effect is a harm (< 0), REVERT when
it is a gain (> 0). At a true 0 % any KEEP or REVERT is a false claim. The fixed-length
protocol is matched to the sequential one at the smallest N whose rates are equal or better:
over the target region (|effect| >= 5 %), and over every true effect (wrong at +-2, +-5,
+-10 % and false claims at 0); then their loads are compared.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
BASE_NAME = "AR(1) lag-1 0.6, CV 3 %"
DRIFT_NAME = "AR + drift 20 %/30 min"
PEER_NAME = "AR, CV 7.5 % (issue's peer measurement)"
BIG = (-10.0, -5.0, 5.0, 10.0)
NONZERO = (-10.0, -5.0, -2.0, 2.0, 5.0, 10.0)


def wilson(k: int, n: int) -> tuple[float, float]:
    """95 % Wilson interval of a rate k/n."""
    if n == 0:
        return 0.0, 1.0
    z, p = 1.96, k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n)


def rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def wrong(decisions: dict[str, int], effect: float) -> int:
    if effect < 0:
        return decisions.get("KEEP", 0)
    if effect > 0:
        return decisions.get("REVERT", 0)
    return 0


def claims(decisions: dict[str, int]) -> int:
    return decisions.get("KEEP", 0) + decisions.get("REVERT", 0)


def _seq(sim: dict, protocol: str = "interleaved", looks: int = 0) -> dict[str, dict]:
    """Cells of `protocol` with the `looks`-th plan of run_sim.LOOKS (0: the default)."""
    wanted = sim["looks"][looks]
    out: dict[str, dict] = {}
    for c in sim["sequential"]:
        if c["protocol"] == protocol and c["looks"] == wanted:
            out.setdefault(c["noise"], {})[c["effect_pct"]] = c
    return out


def _fixed(sim: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for c in sim["fixed"]:
        out.setdefault(c["noise"], {})[c["effect_pct"]] = c
    return out


def worst(cells: dict, effects: tuple[float, ...]) -> tuple[int, int]:
    """(wrong, trials) at the worst of `effects`, sequential cells."""
    c = max((cells[e] for e in effects), key=lambda c: wrong(c["decisions"], c["effect_pct"]))
    return wrong(c["decisions"], c["effect_pct"]), c["trials"]


def fixed_rates(cells: dict, n: str, rule: str, effects: tuple[float, ...]) -> tuple[float, float]:
    """(worst wrong rate over `effects`, false-claim rate at 0) of the fixed protocol."""
    w = max(wrong(cells[e]["by_n"][n][rule], e) / cells[e]["trials"] for e in effects)
    return w, claims(cells[0.0]["by_n"][n][rule]) / cells[0.0]["trials"]


def fixed_load(cells: dict, n: str) -> float:
    return sum(c["by_n"][n]["load_s_mean"] for c in cells.values()) / len(cells)


def seq_load(cells: dict, effects: tuple[float, ...]) -> float:
    return sum(cells[e]["load_s_mean"] for e in effects) / len(effects)


def right(decisions: dict[str, int], effect: float) -> int:
    """KEEP for a gain, REVERT for a harm (of at least 5 %)."""
    return decisions.get("KEEP" if effect > 0 else "REVERT", 0)


def match(seq: dict, fixed: dict, ns: list[int], rule: str, effects: tuple[float, ...]) -> str:
    """'N (load s, ratio)' of the cheapest fixed N whose wrong-verdict rates over `effects`
    (and false claims at 0, when 0 is among them) are no worse than the sequential's, and
    whose rate of right verdicts at +-5 and +-10 % is no more than 1 point below it: a
    protocol that seldom decides is seldom wrong, so the power must match too."""
    k, n = worst(seq, effects)
    f0 = claims(seq[0.0]["decisions"]) / seq[0.0]["trials"]
    power = min(right(seq[e]["decisions"], e) / seq[e]["trials"] for e in BIG)
    load = seq_load(seq, effects)
    for size in ns:
        w, c0 = fixed_rates(fixed, str(size), rule, effects)
        fixed_power = min(
            right(fixed[e]["by_n"][str(size)][rule], e) / fixed[e]["trials"] for e in BIG
        )
        if w <= k / n and (0.0 not in effects or c0 <= f0) and fixed_power >= power - 0.01:
            fl = fixed_load(fixed, str(size))
            return f"{size} ({fl:.0f} s, {fl / load:.1f}x)"
    fl = fixed_load(fixed, str(ns[-1]))
    return f"> {ns[-1]} (> {fl:.0f} s, > {fl / load:.1f}x)"


def simulated_tables(sim: dict) -> list[str]:
    seq, fixed, before = _seq(sim), _fixed(sim), _seq(sim, "every-pair")
    ns = sim["fixed_n"]
    every = (0.0, *NONZERO)
    lines = [
        "### Simulated trials: sequential (interleaved, default policy) vs fixed length",
        "",
        f"{seq[BASE_NAME][0.0]['trials']} sequential trials per cell, "
        f"{fixed[BASE_NAME][0.0]['trials']} fixed-length trials per cell and N; rates with "
        "their 95 % interval. Load: seconds of load on the server, warm-ups included, mean "
        "over the effects matched. Fixed: one run of N requests per arm, baseline then "
        "candidate, judged by its point estimate against the same margins (as a reader of "
        f"bench_serving output would); N from {', '.join(map(str, ns))}: the cheapest "
        "whose wrong-verdict rates are equal or better and whose right-verdict rate at "
        "+-5/+-10 % is at most 1 point lower (load ratio = fixed / sequential). Right "
        "verdicts of the sequential procedure at +-5/+-10 %: see the per-effect table. "
        "Before: the procedure this replaced (the confidence sequence looked at after every "
        "pair), on the same simulated machines.",
        "",
        "| noise model | wrong, abs(effect) >= 5 % | wrong, +-2 % | A/A: equivalent | "
        "A/A: false claim | load s | before: A/A equivalent, load s | "
        "fixed N matched at abs(effect) >= 5 % | fixed N matched at every effect |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, cells in seq.items():
        kb = sum(wrong(cells[e]["decisions"], e) for e in BIG)
        nb = sum(cells[e]["trials"] for e in BIG)
        k2 = sum(wrong(cells[e]["decisions"], e) for e in (-2.0, 2.0))
        n2 = sum(cells[e]["trials"] for e in (-2.0, 2.0))
        zero = cells[0.0]
        old = before.get(name)
        was = (
            f"{100 * old[0.0]['findings'].get('equivalent', 0) / old[0.0]['trials']:.1f} %, "
            f"{seq_load(old, every):.0f}"
            if old
            else "-"
        )
        lines.append(
            f"| {name} | {rate(kb, nb)} | {rate(k2, n2)} | "
            f"{rate(zero['findings'].get('equivalent', 0), zero['trials'])} | "
            f"{rate(claims(zero['decisions']), zero['trials'])} | "
            f"{seq_load(cells, every):.0f} | {was} | "
            f"{match(cells, fixed[name], ns, 'point', BIG)} | "
            f"{match(cells, fixed[name], ns, 'point', every)} |"
        )
    welch = [
        f"| {name} | {match(cells, fixed[name], ns[1:], 'welch', BIG)} | "
        f"{match(cells, fixed[name], ns[1:], 'welch', every)} |"
        for name, cells in seq.items()
    ]
    lines += [
        "",
        "The fixed-length protocol judged instead by flagtrial's earlier Welch t interval on "
        "16-request windows:",
        "",
        "| noise model | fixed N matched at abs(effect) >= 5 % | fixed N matched at every effect |",
        "|---|---|---|",
        *welch,
    ]
    main = seq[BASE_NAME]
    lines += [
        "",
        f"### Per true effect, {BASE_NAME} (interleaved)",
        "",
        "Time to a verdict: wall seconds of measurement, restarts included, as p10 / median "
        "/ p90 over the trials.",
        "",
        "| true effect | KEEP | REVERT | INCONCLUSIVE: equivalent / unresolved | "
        "time to a verdict s (p10 / p50 / p90) | before: p50 / p90 | mean load s | "
        "mean runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    old_main = before.get(BASE_NAME, {})
    for e, c in sorted(main.items()):
        d, f, n = c["decisions"], c["findings"], c["trials"]
        q = c.get("wall_s_pct", {})
        o = old_main.get(e, {}).get("wall_s_pct", {})
        lines.append(
            f"| {e:+g} % | {d.get('KEEP', 0) / n:.1%} | {d.get('REVERT', 0) / n:.1%} | "
            f"{f.get('equivalent', 0) / n:.1%} / {f.get('unresolved', 0) / n:.1%} | "
            f"{' / '.join(f'{q[k]:.0f}' for k in ('10', '50', '90')) if q else '-'} | "
            f"{' / '.join(f'{o[k]:.0f}' for k in ('50', '90')) if o else '-'} | "
            f"{c['load_s_mean']:.0f} | {c['runs_mean']:.1f} |"
        )
    lines += [
        "",
        f"### Design choices measured ({BASE_NAME}; with drift 20 %/30 min where named)",
        "",
        "| procedure | wrong, any effect (worst) | A/A equivalent | mean load s |",
        "|---|---|---|---|",
    ]
    plans = sim.get("looks", [])

    def plan_label(i: int) -> str:
        first, growth = plans[i]
        return f"interleaved, looks from {first} pairs, x{growth:g} each"

    variants = [
        (plan_label(0) + " (default)", _seq(sim), BASE_NAME),
        *((plan_label(i), _seq(sim, looks=i), BASE_NAME) for i in range(1, len(plans))),
        ("interleaved, confidence sequence after every pair (before)", before, BASE_NAME),
        ("interleaved, drift", _seq(sim), DRIFT_NAME),
        ("before-after + re-check (6 runs before)", _seq(sim, "before-after"), BASE_NAME),
        ("before-after + re-check, drift", _seq(sim, "before-after"), DRIFT_NAME),
    ]
    for label, table, noise in variants:
        cells = table.get(noise)
        if not cells:
            continue
        k, n = worst(cells, NONZERO)
        zero = cells[0.0]
        lines.append(
            f"| {label} | {rate(k, n)} | "
            f"{rate(zero['findings'].get('equivalent', 0), zero['trials'])} | "
            f"{seq_load(cells, every):.0f} |"
        )
    return lines


def real_table(real: dict) -> list[str]:
    trials = real["trials"]
    w = real["workload"]
    hygiene = "disturbed runs set aside" if real.get("hygiene", "on") == "on" else "hygiene off"
    driver = real.get("driver", "flagtrial.sequential driven by the harness")
    procedure = real.get("procedure", "before: the confidence sequence after every pair")
    lines = [
        f"### Real trials on llama-server ({driver}, {procedure}; {hygiene}; "
        f"{real['model']} model, {real['cpus']} CPUs, c={w['concurrency'][0]}, "
        f"{w['requests_per_run']} requests of "
        f"{w['prompt_words']} words x {w['max_tokens']} tokens a run, at most "
        f"{real['policy']['max_seconds']:g}s a trial)",
        *([f"Conditions: {real['conditions']}."] if "conditions" in real else []),
        "",
        "Right: KEEP for a gain, REVERT for a harm, equivalent for A/A. Rates with their 95 % "
        "interval.",
        "",
        "| kind | truth | trials | KEEP | REVERT | INCONCLUSIVE: equivalent / unresolved | "
        "right | right within 120 s | time to a verdict s (min / median / max) | mean runs | "
        "mean load s | foreign CPU (median cores) | runs flagged |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[dict]] = {}
    for t in trials:
        groups.setdefault((t["kind"], t["truth"]), []).append(t)
    right_of = {"none": ("INCONCLUSIVE", "equivalent"), "harm": ("REVERT", None)}
    right_of["gain"] = ("KEEP", None)
    for (kind, truth), ts in groups.items():
        n = len(ts)
        count = {d: sum(t["decision"] == d for t in ts) for d in ("KEEP", "REVERT")}
        eq = sum(t["finding"] == "equivalent" for t in ts)
        unres = sum(t["decision"] == "INCONCLUSIVE" and t["finding"] != "equivalent" for t in ts)
        want, finding = right_of[truth]
        right = sum(
            t["decision"] == want and (finding is None or t["finding"] == finding) for t in ts
        )
        times = sorted(t.get("measure_s") or math.inf for t in ts)
        fast = sum(
            t["decision"] == want
            and (finding is None or t["finding"] == finding)
            and (t.get("measure_s") or math.inf) <= 120
            for t in ts
        )
        spread = (
            f"{times[0]:.0f} / {times[n // 2]:.0f} / {times[-1]:.0f}"
            if math.isfinite(times[-1])
            else "-"
        )
        lines.append(
            f"| {kind} | {truth} | {n} | {count['KEEP']} | {count['REVERT']} | {eq} / {unres} | "
            f"{rate(right, n)} | {rate(fast, n) if 'measure_s' in ts[0] else '-'} | {spread} | "
            f"{sum(t['runs'] for t in ts) / n:.1f} | "
            f"{sum(t['load_s'] for t in ts) / n:.0f} | "
            f"{sorted(t['foreign_cores_median'] for t in ts)[n // 2]:.2f} | "
            f"{sum(t['disturbed'] for t in ts)}/{sum(t['runs'] for t in ts)} |"
        )
    lines += ["", "Why each trial stopped:", ""]
    lines += [f"- {t['kind']} ({t['truth']}): {t['decision']}: {t['why']}" for t in trials]
    return lines


def noise_table(fit: dict) -> list[str]:
    m = fit["measured"]
    tok, ttft = m["output_tok_s"], m["ttft_p99"]
    return [
        f"### Measured on this machine ({m['runs']} runs in {m['blocks']} restart blocks over "
        f"{m['minutes']:.0f} min; run {m['run_s_median']:.1f}s, restart "
        f"{m['restart_s_median']:.2f}s)",
        "",
        "| metric | CV | lag-1 | lag-2 | restart ICC | first run after restart | "
        "drift per 30 min |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {label} | {v['cv']:.1%} | {v['lag1']:.2f} | {v['lag2']:.2f} | "
            f"{v['restart_icc']:.2f} | {-v['warmup_pct']:+.1f} % | "
            f"{v['drift_pct_per_30min']:+.1f} % |"
            for label, v in (("output tok/s", tok), ("TTFT p99", ttft))
        ),
        "",
        f"Foreign CPU load during the runs (other work on the machine): median "
        f"{m['foreign_cores_median']:.2f} cores; "
        f"{m['disturbed_share_at_0.5_cores']:.0%} of runs above the default 0.5-core limit. "
        f"Throughput fell {m['foreign_effect_pct_per_core']:+.0f} % per foreign core "
        f"(CV {m['cv_after_foreign']:.1%} after removing it). One extra busy process: "
        f"{m.get('busy1_pct', math.nan):+.0f} %, two: {m.get('busy2_pct', math.nan):+.0f} %.",
    ]


def _worst_error(rates: tuple[float, float]) -> float:
    return 100 * max(rates)


def plot(sim: dict, real: list[dict], path: Path) -> None:
    seq, fixed = _seq(sim), _fixed(sim)
    ns = sim["fixed_n"]
    every = (0.0, *NONZERO)
    fig, axes = plt.subplots(1, 3 if real else 2, figsize=(18 if real else 12, 5))
    ax = axes[0]
    for name in (
        BASE_NAME,
        DRIFT_NAME,
        "all of the above, CV 3 %",
        "AR, CV 7.5 % (issue's peer measurement)",
    ):
        cells = seq[name]
        es = sorted(cells)
        ax.plot(es, [cells[e]["load_s_mean"] for e in es], marker="o", label=f"sequential: {name}")
    for n in ns[1:]:
        load = fixed_load(fixed[BASE_NAME], str(n))
        ax.axhline(load, color="grey", lw=0.6, ls=":")
        ax.text(-10, load * 1.05, f"fixed, N = {n} per arm", fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("true effect of the change (%)")
    ax.set_ylabel("load seconds per trial (mean)")
    ax.set_title("load spent until the verdict")
    ax.legend(fontsize=6, loc="upper right")
    ax = axes[1]
    for name, colour in ((BASE_NAME, "tab:blue"), (DRIFT_NAME, "tab:orange")):
        cells = fixed[name]
        for rule, style in (("point", "s-"), ("welch", "^--")):
            sizes = [n for n in ns if rule == "point" or n > 16]
            xs = [fixed_load(cells, str(n)) for n in sizes]
            ys = [_worst_error(fixed_rates(cells, str(n), rule, NONZERO)) for n in sizes]
            label = "point estimate" if rule == "point" else "Welch judge"
            ax.plot(xs, ys, style, color=colour, label=f"fixed, {label}: {name}")
            for n, x, y in zip(sizes, xs, ys, strict=True):
                ax.annotate(f"{n}", (x, y), fontsize=6)
        k, n = worst(seq[name], NONZERO)
        f0 = claims(seq[name][0.0]["decisions"]) / seq[name][0.0]["trials"]
        ax.plot(
            [seq_load(seq[name], every)],
            [100 * max(k / n, f0)],
            "*",
            ms=16,
            color=colour,
            label=f"sequential: {name}",
        )
    ax.set_xscale("log")
    ax.set_xlabel("load seconds per trial (mean over the seven true effects)")
    ax.set_ylabel("worst error rate, % (wrong verdict at +-2..10 %, false claim at 0)")
    ax.set_title("error rate against load (fixed N labelled)")
    ax.legend(fontsize=6)
    if real:
        ax = axes[2]
        colours = {"KEEP": "tab:green", "REVERT": "tab:red", "INCONCLUSIVE": "tab:grey"}
        kinds = sorted({(t["kind"], t["truth"]) for t in real})
        for i, (kind, truth) in enumerate(kinds):
            ts = [t for t in real if (t["kind"], t["truth"]) == (kind, truth)]
            for j, t in enumerate(ts):
                marker = "x" if t["finding"] == "unresolved" else "o"
                ax.scatter(t["load_s"], i + 0.04 * j, color=colours[t["decision"]], marker=marker)
        ax.set_yticks(range(len(kinds)), [f"{k}, truth: {t}" for k, t in kinds])
        for decision, colour in colours.items():
            ax.scatter([], [], color=colour, label=decision)
        ax.scatter([], [], color="tab:grey", marker="x", label="primary interval unresolved")
        ax.set_xlabel("load seconds until the verdict")
        ax.set_title("real trials on llama-server (small model, 2 CPUs)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    results = json.loads((HERE / "results.json").read_text())
    lines = ["# Verdict harness results", ""]
    fit_path = HERE / "noise_fit.json"
    if fit_path.exists():
        lines += [*noise_table(json.loads(fit_path.read_text())), ""]
    if "simulated" in results:
        lines += [*simulated_tables(results["simulated"]), ""]
    for key in sorted(k for k in results if k.startswith("real")):
        lines += [*real_table(results[key]), ""]
    (HERE / "results.md").write_text("\n".join(lines))
    if "simulated" in results:
        # the trials of the procedure before (no "procedure" recorded) on their own rows
        real = [
            {**t, "kind": t["kind"] if "procedure" in v else f"{t['kind']} (before)"}
            for k, v in results.items()
            if k.startswith("real")
            for t in v["trials"]
        ]
        plot(results["simulated"], real, HERE / "verdicts.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
