"""A trial's states as the ledger journals them, the transitions allowed between them, and
which are final (the journal closed).

Forward: planned -> preflighted -> measuring-baseline (the known-good as found), then per
block [gates ->] [installing ->] restarting -> [facts ->] measuring | measuring-baseline,
then judged -> [installing -> restarting ->] kept | reverting -> reverted. From any state
whose journal is open: reverting (interrupted after the candidate's install), aborted
(stopped before it), recovered (a later command rolled it back); a later command promotes
a trial judged KEEP to kept. A fleet host's promotion: planned -> installing -> restarting
-> facts -> judged -> kept | reverting -> reverted.

An attribution's restarts (flagtrial.attribution) are journaled as a trial too: preflighted
-> (installing -> restarting [-> facts | measuring]) per subset of the edits -> reverting ->
reverted.
"""

from __future__ import annotations

from enum import StrEnum

from flagtrial.errors import LedgerError


class TrialState(StrEnum):
    PLANNED = "planned"
    PREFLIGHTED = "preflighted"
    GATES = "gates"
    MEASURING_BASELINE = "measuring-baseline"
    INSTALLING = "installing"
    RESTARTING = "restarting"
    FACTS = "facts"
    MEASURING = "measuring"
    JUDGED = "judged"
    KEPT = "kept"
    REVERTING = "reverting"
    REVERTED = "reverted"
    ABORTED = "aborted"
    RECOVERED = "recovered"


S = TrialState
FINAL = frozenset({S.KEPT, S.REVERTED, S.ABORTED, S.RECOVERED})
# Where an open journal may go from anywhere: an interruption, or recovery by a later command.
_EXITS = frozenset({S.REVERTING, S.ABORTED, S.RECOVERED})
_AFTER_BLOCK = frozenset({S.INSTALLING, S.RESTARTING, S.JUDGED})
_FORWARD: dict[TrialState, frozenset[TrialState]] = {
    # installing: a fleet host's promotion, the change judged on its canary (flagtrial.fleet)
    S.PLANNED: frozenset({S.PREFLIGHTED, S.INSTALLING}),
    # the gates' findings, when there are any, before the first run
    S.PREFLIGHTED: frozenset({S.GATES, S.MEASURING_BASELINE}),
    S.GATES: frozenset({S.MEASURING_BASELINE}),
    S.MEASURING_BASELINE: _AFTER_BLOCK,
    S.MEASURING: _AFTER_BLOCK,
    S.INSTALLING: frozenset({S.RESTARTING}),
    # into a block's runs, its facts, an early verdict, or (keeping) the end
    S.RESTARTING: frozenset({S.MEASURING_BASELINE, S.MEASURING, S.FACTS, S.JUDGED}),
    S.FACTS: frozenset({S.MEASURING, S.JUDGED}),
    # kept: judged KEEP, or promoted by a later command from any step after the verdict
    S.JUDGED: frozenset({S.INSTALLING, S.KEPT}),
    S.REVERTING: frozenset({S.REVERTED, S.KEPT}),
}
_FORWARD[S.INSTALLING] |= {S.KEPT}
_FORWARD[S.RESTARTING] |= {S.KEPT}
# an attribution: from its plan, or from one subset's start (read or failed), to the next
_FORWARD[S.PREFLIGHTED] |= {S.INSTALLING}
_FORWARD[S.RESTARTING] |= {S.INSTALLING}
_FORWARD[S.FACTS] |= {S.INSTALLING}
TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    s: frozenset() if s in FINAL else _FORWARD[s] | _EXITS for s in S
}


class TransitionError(LedgerError):
    """A journal write the state machine does not allow: a bug, refused before it is written."""


def check(old: TrialState, new: TrialState, trial_id: int) -> None:
    if new not in TRANSITIONS[old]:
        raise TransitionError(f"trial {trial_id}: no transition from {old} to {new}")
