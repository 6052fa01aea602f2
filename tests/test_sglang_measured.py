"""A trial of the real SGLang 0.5.23 server on CPU (tests/harness/sglang_fixtures.py) whose
assertions rest on what it measures: its verdict must find no effect where there is none, so
the module has the machine to itself (harness/machine.py). The rest of the real server's tests
share the machine (test_sglang_real.py)."""

from __future__ import annotations

import pytest

from harness.sglang_fixtures import SglangTrials


@pytest.mark.slow
@pytest.mark.timeout(1200)  # one or two real SGLang starts on CPU, or more
def test_a_setting_moved_unasked_is_attributed_by_each_edits_own_resolution(
    sglang_trials: SglangTrials,
) -> None:
    """SGLang sizes its static memory from the chunked-prefill size
    (srt/arg_groups/memory_hook.py `_handle_gpu_memory_settings`): `--chunked-prefill-size
    1024` moves mem_fraction_static unasked, as the trial's resolution predicted and the
    server reports. The known-good with each edit alone, resolved by the engine: only that
    edit moves it, so no restart is spent to find it (a search by restarts would start each
    edit alone and restore the known-good: 3 starts)."""
    out = sglang_trials.attributed_trial(
        "--set", "--watchdog-timeout=400", "--set", "--chunked-prefill-size=1024",
    )  # fmt: skip
    assert "mem_fraction_static" in {c["name"] for c in out["diff"]["implicit"]}, out["diff"]
    # no measured effect to attribute (it would be measured by restarts of its own)
    assert out["verdict"]["finding"] not in ("harm", "gain"), out["verdict"]
    attributed = out["attribution"]
    assert attributed["used"]["restarts"] == 0 and attributed["journals"] == []
    assert attributed["resolutions"] == 3  # the known-good, and each edit alone
    watchdog, chunk = attributed["edits"]
    assert any(
        e.startswith(
            "the engine's own resolution of the known-good with only this edit: "
            "mem_fraction_static 0."
        )
        for e in chunk["evidence"]
    ), chunk
    assert not any("mem_fraction_static" in e for e in watchdog["evidence"]), watchdog
    assert watchdog["outcome"] in ("useless", "unresolved")
