"""Stand-in for `sgl_kernel`, installed by scripts/install-sglang.sh: NOT SGLang's kernels.

Why: with SGLANG_USE_CPU_ENGINE=1, SGLang 0.5.23 imports eight CPU kernels from `sgl_kernel`
at module load (e.g. sglang/kernels/ops/kvcache/cache_move.py:10
`from sgl_kernel import copy_all_layer_kv_cache_cpu`). PyPI has no CPU build of sgl-kernel
(`sglang-kernel` 0.4.10 holds only sm90/sm100 CUDA ops, no sdist); the CPU extension builds
only from GitHub source, which the test machines cannot reach. On a CPU without Intel AMX
(this project's machines) SGLang runs its torch_native fallback, which never calls those
kernels: all of them are speculative-decoding or KV-move helpers (`alloc_for_spec_decode`,
`copy_all_layer_kv_cache_func`). So plain serving works, and speculative decoding (or any
other path that calls one) fails with the NotImplementedError below, naming the kernel.
"""

__version__ = "0.0.0+flagtrial-stand-in"


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"sgl_kernel.{name}: the CPU build of sgl-kernel is not installed "
            "(flagtrial's stand-in module, scripts/sglang-cpu/sgl_kernel)"
        )

    missing.__name__ = name
    return missing
