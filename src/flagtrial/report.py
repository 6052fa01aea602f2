"""Reports of a trial for people (HTML with plots) from the ledger."""

from __future__ import annotations

import time

import plotly.graph_objects as go
from jinja2 import Environment, PackageLoader, select_autoescape
from plotly.subplots import make_subplots

from flagtrial.facts import CAPACITY_LABELS
from flagtrial.guardrails import METRICS
from flagtrial.ledger import Ledger
from flagtrial.records import RunRow

PLOTTED = ("output_tok_s", "ttft_p50", "ttft_p99", "itl_p50")


def _plots(runs: list[RunRow]) -> str:
    """Per-run values in the order measured, one panel per metric, coloured by arm; a run
    with foreign load is drawn as an x, its reason in the hover text."""
    if not runs:
        return ""
    fig = make_subplots(rows=1, cols=len(PLOTTED), subplot_titles=[METRICS[m][0] for m in PLOTTED])
    colours = {"baseline": "#4c78a8", "candidate": "#e45756"}
    for col, metric in enumerate(PLOTTED, start=1):
        for arm, colour in colours.items():
            for flagged in (False, True):
                points = [
                    (i, r) for i, r in enumerate(runs, start=1)
                    if r.arm == arm and bool(r.disturbed) == flagged
                    and r.summary.get(metric) is not None
                ]  # fmt: skip
                if not points:
                    continue
                fig.add_trace(
                    go.Scatter(
                        x=[i for i, _ in points],
                        y=[r.summary[metric] for _, r in points],
                        mode="markers",
                        name=f"{arm} (foreign load)" if flagged else arm,
                        legendgroup=f"{arm}{flagged}",
                        showlegend=col == 1,
                        marker={"color": colour, "size": 9, "symbol": "x" if flagged else "circle"},
                        text=[
                            f"block {r.block + 1}, c={r.concurrency}"
                            + (f"<br>{r.disturbed}" if flagged else "")
                            for _, r in points
                        ],
                    ),
                    row=1,
                    col=col,
                )
    fig.update_layout(height=380, margin={"t": 60, "b": 40, "l": 40, "r": 20})
    fig.update_xaxes(title_text="run, in the order measured")
    html: str = fig.to_html(full_html=False, include_plotlyjs=True)
    return "<h2>Runs</h2>" + html


def render_html(ledger: Ledger, trial_id: int) -> str:
    trial = ledger.trial(trial_id)
    diff = trial.diff
    capacity = [
        {"label": CAPACITY_LABELS.get(c.name, c.name), "before": c.before, "after": c.after,
         "pct": c.pct}
        for c in (diff.capacity if diff else [])
    ]  # fmt: skip
    implicit = [c.describe() for c in (diff.implicit if diff else [])]
    env = Environment(
        loader=PackageLoader("flagtrial", "templates"), autoescape=select_autoescape(["j2"])
    )
    events = [
        {"at": time.strftime("%T", time.localtime(e.at)), "state": e.state, "detail": e.detail}
        for e in ledger.events(trial_id)
    ]
    return env.get_template("trial.html.j2").render(
        trial=trial,
        started=time.strftime("%F %T", time.localtime(trial.started_at)),
        capacity=capacity,
        implicit=implicit,
        effects=trial.effects,
        plots=_plots(ledger.runs(trial_id)),
        events=events,
    )
