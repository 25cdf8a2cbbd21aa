"""The input contract of a calibration: the input size and preprocessing it was fitted with.

A calibration holds for inputs preprocessed like its calibration data — Neural Clamping's δ is
one tensor shaped like one of them. The contract is measured on the calibration data when
fitting (:func:`describe_inputs`), recorded in ``calibration_config.json`` as
``input_contract``, and written into the saved preprocessing — timm's
``pretrained_cfg["input_size"]`` (:func:`timm_export_config`), the image processor's size or
the tokenizer's ``model_max_length`` (:func:`contract_preprocessor`) — so that pipelines and
``from_pretrained`` users preprocess to it. :func:`evaluation_options` makes it the default of
an evaluation and warns about an explicit setting that differs. A timm config's test-time settings
(``test_input_size``, ``test_crop_pct``) are not used, as by ``timm.data.resolve_data_config``'s default: a fit
that preprocessed raw images with the config says so (:func:`unused_test_time_settings`), and the saved timm
config drops them (:func:`timm_export_config`).

``input_contract`` (JSON):
    space (str): where δ lives: ``"pixel_values"``, ``"inputs_embeds"`` or ``"input"``.
    shape (list[int] | None): δ's shape; None for methods without δ.
    input_size (list[int] | None): per-sample shape of the calibration inputs (images, plain
        tensors); None for text.
    preprocessing (dict): ``source`` (where the facts come from) and, for images,
        ``input_size``, ``mean``, ``std`` and the resize / crop settings; for text
        ``max_length``, ``truncation``, ``truncation_side`` and ``padding_side``.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .._warnings import warn_user
from .base import Backbone, Inputs, format_size

#: side of the blank square image used to read off what size an image processor produces
PROBE_IMAGE_SIDE = 64
#: tokenizers without a length limit report a huge model_max_length (transformers uses 1e30)
UNBOUNDED_LENGTH = 10**12
TIMM_KEYS = ("input_size", "mean", "std", "interpolation", "crop_pct", "crop_mode")
#: timm's test-time settings (``pretrained_cfg`` keys), by the setting each replaces under ``use_test_size=True``
TIMM_TEST_TIME_KEYS = {"input_size": "test_input_size", "crop_pct": "test_crop_pct"}
#: the crop timm applies where a config gives no crop_pct (timm.data.DEFAULT_CROP_PCT, not imported: timm is optional)
TIMM_DEFAULT_CROP_PCT = 0.875
#: the ``source`` of the preprocessing facts when the library preprocessed raw images with the model's own config
MODEL_CONFIG_SOURCE = "the model's config"
IMAGE_PROCESSOR_KEYS = (
    "do_resize", "size", "resample", "do_center_crop", "crop_size", "crop_pct", "do_rescale", "rescale_factor",
    "do_normalize", "image_mean", "image_std",
)


# ----------------------------------------------------------------------------- kinds and facts


def is_tokenizer(preprocessor: Any) -> bool:
    return hasattr(preprocessor, "model_max_length") and hasattr(preprocessor, "padding_side")


def is_image_processor(preprocessor: Any) -> bool:
    """A transformers image processor (called as ``processor(images=..., return_tensors="pt")``)."""
    return hasattr(preprocessor, "preprocess") and not is_tokenizer(preprocessor)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items() if item is not None}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def timm_facts(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The preprocessing keys of a timm ``pretrained_cfg`` or data config, JSON-able."""
    return {key: _jsonable(config[key]) for key in TIMM_KEYS if key in config}


def timm_test_time_facts(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The test-time settings a timm ``pretrained_cfg`` recommends, keyed by the setting each replaces
    (``{"input_size": [3, 224, 224], "crop_pct": 0.95}``), JSON-able."""
    return {key: _jsonable(config[test_key]) for key, test_key in TIMM_TEST_TIME_KEYS.items() if config.get(test_key) is not None}


def image_processor_facts(processor: Any) -> Dict[str, Any]:
    """Resize, crop, rescale and normalisation settings of a transformers image processor."""
    data_config = getattr(processor, "data_config", None)  # transformers' TimmWrapperImageProcessor
    if isinstance(data_config, Mapping):
        return {"source": type(processor).__name__, **timm_facts(data_config)}
    config = processor.to_dict()
    return {"source": type(processor).__name__, **{key: _jsonable(config[key]) for key in IMAGE_PROCESSOR_KEYS if key in config}}


def model_max_length(tokenizer: Any) -> Optional[int]:
    """The tokenizer's length limit, or None when it has none."""
    value = getattr(tokenizer, "model_max_length", None)
    return int(value) if isinstance(value, int) and value < UNBOUNDED_LENGTH else None


def tokenizer_facts(tokenizer: Any, max_length: Optional[int]) -> Dict[str, Any]:
    """How texts are tokenized: truncated at ``max_length`` (default: the tokenizer's limit)."""
    return {
        "source": type(tokenizer).__name__,
        "max_length": max_length if max_length is not None else model_max_length(tokenizer),
        "truncation": True,
        "truncation_side": getattr(tokenizer, "truncation_side", "right"),
        "padding_side": getattr(tokenizer, "padding_side", "right"),
    }


def image_preprocessing(
    model_facts: Dict[str, Any], preprocessor: Any, input_size: Optional[Sequence[int]]
) -> Dict[str, Any]:
    """An image model's preprocessing facts: the image processor's when one is used, else ``model_facts``
    (its config's); ``input_size`` (the calibrated one) replaces any declared size."""
    if is_image_processor(preprocessor):
        facts = image_processor_facts(preprocessor)
    elif callable(preprocessor):
        facts = {**model_facts, "source": f"{type(preprocessor).__name__} (a callable; other facts: the model's config)"}
    else:  # raw images are preprocessed with these; tensors given by the user were used as they are
        facts = {**model_facts, "source": MODEL_CONFIG_SOURCE}
    if input_size is not None:
        facts["input_size"] = list(input_size)
    return facts


# ----------------------------------------------------------------------------- image sizes


def processor_output_size(processor: Any) -> Optional[Tuple[int, int]]:
    """(height, width) of the images an image processor produces (read off one blank square image)."""
    if not is_image_processor(processor):
        return None
    from PIL import Image

    try:
        pixels = processor(images=Image.new("RGB", (PROBE_IMAGE_SIDE, PROBE_IMAGE_SIDE)), return_tensors="pt")["pixel_values"]
    except (TypeError, ValueError, KeyError, RuntimeError):
        return None
    return int(pixels.shape[-2]), int(pixels.shape[-1])


def processor_sizes(processor: Any) -> List[Tuple[str, Tuple[int, ...]]]:
    """``[("the image processor ...", (H, W))]`` when ``processor`` produces one fixed size, else ``[]``."""
    size = processor_output_size(processor)
    return [(f"the image processor ({type(processor).__name__})", size)] if size is not None else []


def _resized_size(size: Mapping[str, Any], height: int, width: int) -> Dict[str, int]:
    if "shortest_edge" in size:
        return {"shortest_edge": min(height, width)}
    return {"height": height, "width": width}


def resized_image_processor(processor: Any, input_size: Sequence[int]) -> Any:
    """A new image processor like ``processor`` but producing ``input_size`` images; ``processor`` is untouched."""
    height, width = (int(v) for v in input_size[-2:])
    data_config = getattr(processor, "data_config", None)
    if isinstance(data_config, Mapping):  # TimmWrapperImageProcessor is built from a timm config
        channels = input_size[0] if len(input_size) == 3 else data_config["input_size"][0]
        config = {**data_config, "input_size": (int(channels), height, width)}
        return type(processor)(pretrained_cfg=config, architecture=getattr(processor, "architecture", None))
    config = processor.to_dict()
    config["size"] = _resized_size(config.get("size") or {}, height, width)
    if config.get("crop_size"):
        config["crop_size"] = {"height": height, "width": width}
    return type(processor).from_dict(config)


def sized_image_processor(preprocessor: Any, input_size: Optional[Sequence[int]]) -> Tuple[Any, bool]:
    """(``preprocessor`` or a resized copy of it producing ``input_size`` images, whether that size is produced).

    Anything that is not an image processor, or produces no fixed size, comes back as it is.
    """
    if input_size is None or not is_image_processor(preprocessor):
        return preprocessor, True
    wanted = tuple(int(v) for v in input_size[-2:])
    if processor_output_size(preprocessor) in (wanted, None):
        return preprocessor, True
    resized = resized_image_processor(preprocessor, input_size)
    if processor_output_size(resized) != wanted:
        return preprocessor, False
    return resized, True


# ----------------------------------------------------------------------------- the contract


def describe_inputs(
    backbone: Backbone, inputs: Inputs, *, preprocessor: Any = None, max_length: Optional[int] = None, preprocessed_here: bool = True
) -> Dict[str, Any]:
    """The input contract (without δ's shape) of calibration data whose first batch is ``inputs``.

    ``preprocessed_here``: the library made ``inputs`` from raw images or texts with ``preprocessor``
    and ``max_length``; otherwise the user did, and only what the inputs show (their size) is known.
    """
    size = backbone.input_size(inputs)
    if preprocessed_here:
        applied, _ = sized_image_processor(preprocessor, size)
        facts = backbone.preprocessing(applied, max_length=max_length, input_size=size)
    else:
        facts = _given_inputs_facts(backbone, size)
    contract = {"space": backbone.delta_space, "input_size": list(size) if size is not None else None, "preprocessing": facts}
    observed = value_range(backbone, inputs)
    return contract if observed is None else {**contract, "value_range": observed}


def value_range(backbone: Backbone, inputs: Inputs) -> Optional[List[float]]:
    """[min, max] of an image batch's pixel values (its first sample's), or None for texts and non-float inputs: what
    shows whether images were normalised (negative values) or scaled to 0–255, cheaply."""
    main = inputs.get(backbone.input_key)
    if backbone.modality != "image" or not hasattr(main, "is_floating_point") or not main.is_floating_point():
        return None
    first = main[:1].detach()
    low, high = float(first.min()), float(first.max())
    return [low, high] if all(map(math.isfinite, (low, high))) else None


def differently_scaled(recorded: Sequence[float], given: Sequence[float]) -> bool:
    """Whether pixel values in ``given`` [min, max] look preprocessed otherwise than ``recorded``: one normalised (with
    negative values) and the other not, or magnitudes more than 10× apart (0–255 against 0–1)."""
    negative = lambda bounds: bounds[0] < -0.05  # noqa: E731
    magnitude = lambda bounds: max(abs(bounds[0]), abs(bounds[1]), 1e-6)  # noqa: E731
    ratio = magnitude(given) / magnitude(recorded)
    return negative(recorded) != negative(given) or not 0.1 <= ratio <= 10.0


def _given_inputs_facts(backbone: Backbone, size: Optional[Tuple[int, ...]]) -> Dict[str, Any]:
    """Preprocessing facts of inputs the user made: measured size; a text's truncation is unknown, an
    image's normalisation is taken from the model's config (which its processor and pipelines apply)."""
    if backbone.modality == "text":
        return {"source": "inputs tokenized by the user (their max_length and truncation are not known)"}
    facts = backbone.preprocessing(input_size=size)
    return {**facts, "source": "inputs preprocessed by the user; other facts: the model's config (not verified)"}


def warn_if_not_declared(backbone: Backbone, contract: Mapping[str, Any], preprocessor: Any = None) -> None:
    """Warn, naming both sizes, for each input size the model or ``preprocessor`` declares that the data do not have;
    and once, naming each, for the test-time settings of the model's config the calibration did not use."""
    _warn_if_test_time_unused(backbone, contract)
    size = contract.get("input_size")
    if size is None:
        return
    for where, declared in backbone.declared_input_sizes(preprocessor):
        if tuple(size[-len(declared):]) == tuple(declared):
            continue
        warn_user(
            f"the calibration data have input size {format_size(size)}, but {where} declares {format_size(declared)}. "
            f"The calibration holds at {format_size(size)} only: that size is recorded (input_contract in "
            "calibration_config.json) and the saved preprocessing resizes to it, so pipelines and from_pretrained "
            f"users get {format_size(size)} inputs; preprocess your own inputs to {format_size(size)} too."
        )


def unused_test_time_settings(backbone: Backbone, contract: Mapping[str, Any]) -> Dict[str, Tuple[Any, Any]]:
    """``{setting: (recommended test-time value, value used)}`` for each test-time setting of the model's config
    (:meth:`~hf_calibrate.backbones.base.Backbone.test_time_preprocessing`) other than the one the library preprocessed
    the calibration's raw images with (which, like ``timm.data.resolve_data_config``'s default and transformers' image
    pipelines, is the model's ``input_size`` and ``crop_pct``); empty when the library did not preprocess them with the
    model's config (inputs the user preprocessed, an image processor or callable given)."""
    facts = contract.get("preprocessing") or {}
    if facts.get("source") != MODEL_CONFIG_SOURCE:
        return {}
    # timm crops at its DEFAULT_CROP_PCT where the config gives no crop_pct (timm.data.create_transform)
    crop = facts.get("crop_pct") if facts.get("crop_pct") is not None else TIMM_DEFAULT_CROP_PCT
    used = {"input_size": contract.get("input_size"), "crop_pct": crop}
    unused = {}
    for key, recommended in backbone.test_time_preprocessing().items():
        same = (recommended[-2:] == list(used[key] or [])[-2:]) if key == "input_size" else recommended == used[key]
        if not same:
            unused[key] = (recommended, used[key])
    return unused


def _settings_text(settings: Mapping[str, Any], *, test_keys: bool = False) -> str:
    """``{"input_size": [3, 32, 32], "crop_pct": 1.0}`` → ``"input_size=3×32×32 and crop_pct=1.0"`` (``test_keys``:
    named by their test-time keys)."""
    named = {TIMM_TEST_TIME_KEYS[key] if test_keys else key: value for key, value in settings.items()}
    return " and ".join(f"{key}={format_size(value) if isinstance(value, list) else value}" for key, value in named.items())


def _data_config_text(settings: Mapping[str, Any]) -> str:
    """``{"input_size": [3, 32, 32], "crop_pct": 1.0}`` → ``"dict(input_size=(3, 32, 32), crop_pct=1.0)"``."""
    return "dict(" + ", ".join(f"{key}={tuple(value) if isinstance(value, list) else value}" for key, value in settings.items()) + ")"


def _warn_if_test_time_unused(backbone: Backbone, contract: Mapping[str, Any]) -> None:
    unused = unused_test_time_settings(backbone, contract)
    if not unused:
        return
    recommended = {key: pair[0] for key, pair in unused.items()}
    used = {key: pair[1] for key, pair in unused.items()}
    warn_user(
        f"the model's pretrained_cfg recommends {_settings_text(recommended, test_keys=True)} for evaluation, which "
        "hf_calibrate does not use: like timm.data.resolve_data_config(model=model) and transformers' image pipelines, it "
        f"preprocessed the calibration images with {_settings_text(used)}. The calibration holds for those only; they "
        "are recorded (input_contract), and a saved calibration's timm config keeps them and drops the test_ settings. To "
        f"calibrate at the test-time settings, save the model with timm.models.save_for_hf(model, folder, "
        f"data_config={_data_config_text(recommended)}) (or set them as input_size and crop_pct in its pretrained_cfg); "
        f"to keep these settings and silence this, save it with data_config={_data_config_text(used)}, which drops "
        "the test_ settings."
    )


def fallback_contract(backbone: Backbone, delta_shape: Optional[Sequence[int]]) -> Dict[str, Any]:
    """The contract of a calibration whose fit did not record one: δ's shape is the input size (images, tensors)."""
    size = list(delta_shape) if delta_shape is not None and backbone.modality != "text" else None
    return {"space": backbone.delta_space, "input_size": size, "preprocessing": backbone.preprocessing(input_size=size)}


def contract_preprocessor(preprocessor: Any, contract: Optional[Mapping[str, Any]]) -> Any:
    """``preprocessor`` made to preprocess as ``contract`` says: a tokenizer copy truncating at the calibrated
    ``max_length``, an image processor copy producing the calibrated size (others are returned as they are)."""
    if preprocessor is None or not contract:
        return preprocessor
    if is_tokenizer(preprocessor):
        limit = (contract.get("preprocessing") or {}).get("max_length")
        if limit is None or model_max_length(preprocessor) == limit:
            return preprocessor
        tokenizer = copy.deepcopy(preprocessor)
        tokenizer.model_max_length = int(limit)
        return tokenizer
    size = contract.get("input_size")
    processor, produces_size = sized_image_processor(preprocessor, size)
    if not produces_size:
        warn_user(
            f"could not make the image processor ({type(preprocessor).__name__}) produce {format_size(size[-2:])} images, "
            f"the size the model was calibrated at; it is kept as it is. Preprocess inputs to {format_size(size)} "
            "yourself, or calibrate on data this processor produces."
        )
    return processor


def timm_export_config(contract: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """``data_config`` for ``timm.models.save_for_hf``: the calibrated input size and crop (None: keep the model's).

    Given these, ``save_for_hf`` drops the config's ``test_input_size`` and ``test_crop_pct``: the saved config
    describes one preprocessing, the calibrated one, even to ``resolve_data_config(use_test_size=True)``.
    """
    contract = contract or {}
    size = contract.get("input_size")
    if size is None or len(size) != 3:
        return None
    crop_pct = (contract.get("preprocessing") or {}).get("crop_pct")
    return {"input_size": tuple(int(v) for v in size), **({"crop_pct": float(crop_pct)} if crop_pct is not None else {})}


def evaluation_options(contract: Optional[Mapping[str, Any]], options: Mapping[str, Any], default_preprocessor: Any) -> Dict[str, Any]:
    """``evaluate`` options with the calibrated preprocessing as default; an explicit different one warns.

    The default preprocessor is the model's own; a text model's ``max_length`` defaults to the
    one it was calibrated with.
    """
    options = dict(options)
    limit = ((contract or {}).get("preprocessing") or {}).get("max_length")
    given = options.get("max_length")
    if limit is not None and given is not None and given != limit:
        warn_user(
            f"evaluating with max_length={given}, but the model was calibrated on texts truncated to max_length={limit}: "
            f"its confidences hold for inputs preprocessed like that. Leave max_length unset to use {limit}."
        )
    if limit is not None and given is None:
        options["max_length"] = limit
    if options.get("preprocessor") is None:
        options["preprocessor"] = default_preprocessor
    elif options["preprocessor"] is not default_preprocessor:
        _warn_if_other_size(options["preprocessor"], contract)
    return options


def _warn_if_other_size(preprocessor: Any, contract: Optional[Mapping[str, Any]]) -> None:
    size = (contract or {}).get("input_size")
    produced = processor_output_size(preprocessor)
    if size is None or produced is None or tuple(size[-2:]) == produced:
        return
    warn_user(
        f"the preprocessor passed produces {format_size(produced)} images, but the model was calibrated at "
        f"{format_size(size)}: its confidences hold for inputs of that size. Leave preprocessor unset to use the "
        "model's own."
    )
