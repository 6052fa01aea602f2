"""The change an attribution leaves to try (`flagtrial trial --from-attribution TRIAL`):
the trial's edits without the harmful and interacting ones, their values as the trial's
candidate ran them."""

from __future__ import annotations

from flagtrial.attribution.outcome import Attribution
from flagtrial.errors import UsageError
from flagtrial.launch.change import Change, Edit, last_value
from flagtrial.launch.schema import FlagSchema
from flagtrial.launch.spec import LaunchSpec
from flagtrial.redact import MARK
from flagtrial.session import Session


async def fixed_change(s: Session, trial_id: int) -> Change:
    """The change the latest attribution of `trial_id` leaves (no harmful or interacting
    edit), its values as the trial's candidate ran them: the ledger keeps a change's secret
    values redacted, the candidate's spec keeps them whole."""
    stored = s.ledger.attribution(trial_id)
    if stored is None:
        raise UsageError(
            f"trial {trial_id} was never attributed: run `flagtrial attribute {trial_id}`"
        )
    fixed = Attribution.model_validate(stored).fixed()
    if fixed is None:
        raise UsageError(
            f"the attribution of trial {trial_id} leaves no change to try: every edit "
            "was harmful or interacting, or none was (the trial's own change)"
        )
    if not any(e.value is not None and MARK in e.value for e in fixed.edits):
        return fixed
    trial = s.ledger.trial(trial_id)
    serving = await s.target.read_spec()
    ran = LaunchSpec(
        kind=serving.kind,
        text=s.ledger.generation(trial.candidate_gen or trial.baseline_gen).spec_text,
        dropin=serving.dropin,
    )
    schema = await s.engine.flag_schema(s.target, ran.program)
    return Change(edits=[_as_ran(e, ran, schema) for e in fixed.edits])


def _as_ran(edit: Edit, ran: LaunchSpec, schema: FlagSchema) -> Edit:
    if edit.value is None or MARK not in edit.value:
        return edit
    value = (
        ran.env.get(edit.name)
        if edit.op == "setenv"
        else last_value(ran, schema, schema.lookup(edit.name))
    )
    if value is None:
        raise UsageError(f"{edit.name}: its value is kept only redacted: give the change by hand")
    return edit.model_copy(update={"value": value})
