"""The tests' one harness, imported as a package (tests/ is on sys.path, as pytest's rootdir
conftest puts it there):

- `harness.cli`: run the `flagtrial` CLI as a user does, in its own process;
- `harness.session`: a library `Session` from a project file;
- `harness.project`: project files rendered from the settings model (flagtrial.settings);
- `harness.hosts`: systemd-nspawn hosts and the module fixture that boots one;
- `harness.standin`, `harness.wheels`: stand-in servers and the engines' real wheels;
- `harness.vllm_fixtures`, `harness.sglang_fixtures`: the real vLLM and SGLang servers;
- `harness.servers`, `harness.runsummaries`, `harness.faultfigures`: small shared pieces.
"""
