"""Which weights are indexed by the data's channels, so a trained model can take other variables.

A forecaster's inputs are named channels (``variable@level``, surface and static fields, time
features, coordinates) and so are its outputs. The layers that see them hold weights indexed by
those channels along some dimensions: patch embedding's rows, patch recovery's columns, the
linear residual's inputs and outputs, a per-channel norm's scale. ``ChannelDim`` says, for one
dimension of one parameter, which channel each entry belongs to; ``channel_dims`` of a layer
returns them for its parameters, and of a model (``Forecaster.channel_dims``) for the whole
model. Fine-tuning (``jigsaw_earth.checkpoint.transfer``) matches the names of a parent's
channels with the new ones: kept entries take the parent's values, removed ones are dropped,
added ones are zero (``zero_new``: weights from a new input or to a new output) or keep the new
model's own initialisation (a norm's scale and shift).

``channel_dims`` must be a pure function of the names it is given: called with a parent's names
it describes the parent's tensors (the sizes of the model at hand are not checked there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ChannelDim", "ChannelDims", "ModelChannels", "prefixed"]


@dataclass(frozen=True)
class ChannelDim:
    """Dimension ``dim`` of a parameter's canonical global tensor is indexed by ``names``.

    Channel ``k`` owns the ``inner`` consecutive entries ``[k·inner, (k+1)·inner)`` (a patch
    embedding's rows are ordered ``(channel, i, j)``: ``inner = p_lat·p_lon``), so the dimension
    has ``len(names)·inner`` entries. ``zero_new``: entries of an added channel start at zero
    (weights from a new input, to a new output: the kept channels' forecast is unchanged);
    otherwise they keep the fine-tuned model's own initialisation (a norm's scale 1, shift 0).
    """

    dim: int
    names: tuple[str, ...]
    inner: int = 1
    zero_new: bool = True

    @property
    def size(self) -> int:
        return len(self.names) * self.inner


#: ``{parameter path: (ChannelDim, ...)}`` for every channel-indexed parameter of a module
ChannelDims = dict[str, tuple[ChannelDim, ...]]


@dataclass(frozen=True)
class ModelChannels:
    """The names of a forecaster's channels, in the order the model reads them.

    ``state``: the prognostic channels (inputs and outputs: ``variable@level`` and surface names);
    ``static``: the static fields after them (store fields, geometry, a stochastic model's noise);
    ``time``: the time features (``data.times.TIME_FEATURES``).
    """

    state: tuple[str, ...]
    static: tuple[str, ...] = ()
    time: tuple[str, ...] = ()

    @classmethod
    def from_lists(
        cls, state: Sequence[str], static: Sequence[str] = (), time: Sequence[str] = ()
    ) -> ModelChannels:
        return cls(tuple(state), tuple(static), tuple(time))


def prefixed(path: str, dims: Mapping[str, tuple[ChannelDim, ...]]) -> ChannelDims:
    """A layer's ``channel_dims`` with its parameters named from the model (``path.weight``)."""
    return {f"{path}.{name}" if path else name: d for name, d in dims.items()}
