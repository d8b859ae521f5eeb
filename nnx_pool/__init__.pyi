"""The public names for type checkers, generated from ``_WHERE`` in __init__.py.

tests/test_functional.py checks that it is up to date.
"""

from nnx_pool import functional as functional
from nnx_pool import reference as reference
from nnx_pool._adaptive import AdaptiveAvgPool as AdaptiveAvgPool
from nnx_pool._adaptive import AdaptiveMaxPool as AdaptiveMaxPool
from nnx_pool._adaptive import SelectAdaptivePool as SelectAdaptivePool
from nnx_pool._attention_pool import AttentionPool as AttentionPool
from nnx_pool._backend import IMPLEMENTATION_DEFAULTS as IMPLEMENTATION_DEFAULTS
from nnx_pool._backend import IMPLEMENTATIONS as IMPLEMENTATIONS
from nnx_pool._backend import current_implementation as current_implementation
from nnx_pool._backend import set_default_implementation as set_default_implementation
from nnx_pool._backend import use_implementation as use_implementation
from nnx_pool._blur import BlurPool as BlurPool
from nnx_pool._cbam import CBAM as CBAM
from nnx_pool._cbam import LightCBAM as LightCBAM
from nnx_pool._context_gates import GlobalContext as GlobalContext
from nnx_pool._eca import EfficientChannelAttention as EfficientChannelAttention
from nnx_pool._eca import eca_kernel_size as eca_kernel_size
from nnx_pool._fractional import FractionalMaxPool as FractionalMaxPool
from nnx_pool._gates import make_divisible as make_divisible
from nnx_pool._generalized import GeMPool as GeMPool
from nnx_pool._generalized import LsePlusPool as LsePlusPool
from nnx_pool._geometry import output_shape as output_shape
from nnx_pool._global import GlobalAvgPool as GlobalAvgPool
from nnx_pool._global import GlobalMaxPool as GlobalMaxPool
from nnx_pool._latent_pool import AttentionPoolLatent as AttentionPoolLatent
from nnx_pool._layout import ChannelsFirstWarning as ChannelsFirstWarning
from nnx_pool._median import MedianPool as MedianPool
from nnx_pool._pool import AvgPool as AvgPool
from nnx_pool._pool import LPPool as LPPool
from nnx_pool._pool import MaxPool as MaxPool
from nnx_pool._pool import MinPool as MinPool
from nnx_pool._squeeze_excite import EffectiveSqueezeExcitation as EffectiveSqueezeExcitation
from nnx_pool._squeeze_excite import SqueezeExcitation as SqueezeExcitation
from nnx_pool._unpool import MaxUnpool as MaxUnpool

__version__: str
__all__: list[str]
