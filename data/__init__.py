"""Sharded ERA5 data pipeline: each rank reads only its latitude × longitude tile (plus halo).

Entry points (see docs/data.md): ``reader.TileReader`` and ``store.StoreView`` (one tile of a
store), ``batch.Batch`` / ``batch.VariableSpec`` / ``batch.channel_names``,
``geometry.latitude_weights`` (from ``jigsaw_earth.sphere``), ``stats.read_statistics`` /
``stats.Normalizer``, ``synth.synth_store``, ``prepare.prepare_store``, ``report.io_report``,
``times`` (time axes, periods, time features, the climatology lookup),
``preflight.store_preflight``. Training batches: ``jigsaw_earth.data.samples.TrainData`` (the
one pipeline). CLI: ``jigsaw-earth data``.
"""
