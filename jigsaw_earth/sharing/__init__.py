"""Share a trained model: one folder with its weights, input contract, model card and reference forecast.

``export.py`` writes the folder from a run (every rank its own blocks), ``folder.py`` opens it with
its integrity checked, ``contract.py`` describes and checks the inputs, ``plain.py`` loads it as a
plain ``nn.Module`` (``jigsaw_earth.load_model``), ``use.py`` serves ``predict --model`` and
``verify.py`` reruns the reference forecast (docs/models.md, "Sharing a model").
"""

from .folder import ModelFolder, is_model_folder
from .plain import SharedModel, load_model

__all__ = ["ModelFolder", "SharedModel", "is_model_folder", "load_model"]
