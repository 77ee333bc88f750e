"""Two small forecasters written outside jigsaw-earth, from its layers (docs/models.md).

``jigsaw_examples.convnet:ConvNet`` and ``jigsaw_examples.transformer:Transformer`` train with
``model.name`` set to those paths (put ``examples/`` on ``PYTHONPATH``, or ``pip install -e
examples``, which also registers them as ``example-convnet`` and ``example-transformer`` through
the ``jigsaw_earth.models`` entry-point group).
"""
