"""``jigsaw-earth bench layers / models / report``: jigsaw against its plain-PyTorch twins.

``cases`` (what is measured), ``measure`` (interleaved timing, peak memory), ``run`` (one rank
and meshes), ``report`` (terminal table and docs/benchmarks.md).
"""

__all__: list[str] = []
