"""Backbone adapters on real timm / transformers models built offline from configs."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, BertModel, ViTConfig, ViTForImageClassification

from hf_calibrate.backbones import (
    TimmBackbone,
    TorchBackbone,
    TransformersTextBackbone,
    TransformersVisionBackbone,
    adapt,
)


@pytest.fixture(scope="module")
def timm_model():
    torch.manual_seed(0)
    return timm.create_model(
        "resnet10t", pretrained=False, num_classes=4, pretrained_cfg_overlay=dict(input_size=(3, 16, 16))
    ).eval()


@pytest.fixture(scope="module")
def vit_model():
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=32, num_labels=3)
    return ViTForImageClassification(config).eval()


@pytest.fixture(scope="module")
def bert_model():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, num_labels=3, pad_token_id=0)
    return BertForSequenceClassification(config).eval()


def test_adapt_picks_the_adapter(timm_model, vit_model, bert_model):
    assert isinstance(adapt(timm_model), TimmBackbone)
    assert isinstance(adapt(vit_model), TransformersVisionBackbone)
    assert isinstance(adapt(bert_model), TransformersTextBackbone)
    assert isinstance(adapt(nn.Linear(3, 2)), TorchBackbone)


def test_unsupported_models_name_what_is_supported():
    bare = BertModel(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8))
    with pytest.raises(TypeError, match="not a classification model.*AutoModelForSequenceClassification"):
        adapt(bare)
    with pytest.raises(TypeError, match="num_classes=0"):
        adapt(timm.create_model("resnet10t", pretrained=False, num_classes=0))
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        adapt(lambda x: x)


def test_delta_shapes_follow_the_input_contract(timm_model, vit_model, bert_model):
    assert adapt(timm_model).default_delta_shape() == (3, 16, 16)
    assert adapt(vit_model).default_delta_shape() == (3, 16, 16)
    assert adapt(bert_model).default_delta_shape() == (16,)
    assert adapt(nn.Linear(3, 2)).default_delta_shape() is None
    assert adapt(timm_model).preprocessing()["input_size"] == [3, 16, 16]


def test_image_delta_is_added_to_pixels(timm_model, vit_model):
    x = torch.randn(2, 3, 16, 16)
    delta = torch.randn(3, 16, 16)
    with torch.no_grad():
        assert torch.equal(adapt(timm_model).logits({"pixel_values": x}, delta), timm_model(x + delta))
        expected = vit_model(pixel_values=x + delta).logits
        assert torch.equal(adapt(vit_model).logits({"pixel_values": x}, delta), expected)


def test_text_delta_touches_every_non_padding_token_only(bert_model):
    backbone = adapt(bert_model)
    input_ids = torch.tensor([[2, 5, 7, 3, 0, 0], [2, 9, 3, 0, 0, 0]])
    mask = (input_ids != 0).long()
    delta = torch.randn(16)
    with torch.no_grad():
        embeddings = bert_model.get_input_embeddings()(input_ids)
        expected = bert_model(inputs_embeds=embeddings + mask[..., None] * delta, attention_mask=mask).logits
        got = backbone.logits({"input_ids": input_ids, "attention_mask": mask}, delta)
        plain = backbone.logits({"input_ids": input_ids, "attention_mask": mask})
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(got, plain)
    # without an attention mask the pad token id decides which tokens get δ
    with torch.no_grad():
        unmasked = bert_model(inputs_embeds=embeddings + mask[..., None] * delta).logits
        assert torch.allclose(backbone.logits({"input_ids": input_ids}, delta), unmasked, atol=1e-6)


@pytest.mark.parametrize("bad_id", [50, 10**6, -1])
@pytest.mark.parametrize("with_delta", [False, True])
def test_token_ids_outside_the_vocabulary_are_named_with_the_fix(bert_model, bad_id, with_delta):
    """An id the embedding has no row for is refused at the boundary (before the model's own
    'IndexError: index out of range in self'), naming the id, the vocabulary and the fix; the last valid id passes."""
    backbone = adapt(bert_model)
    delta = torch.zeros(16) if with_delta else None
    with torch.no_grad():
        assert backbone.logits({"input_ids": torch.tensor([[2, 49, 3]])}, delta).shape == (1, 3)
        with pytest.raises(ValueError) as error:
            backbone.logits({"input_ids": torch.tensor([[2, 5, 3], [2, bad_id, 3]])}, delta)
    message = str(error.value)
    assert f"token id {bad_id}," in message and "vocabulary of 50 tokens (ids 0 to 49)" in message
    assert "model's own tokenizer" in message


def test_delta_shape_mismatch_says_the_expected_shape(timm_model, bert_model):
    with pytest.raises(ValueError, match=r"δ has shape \(3, 16, 16\).*per-sample shape \(3, 32, 32\).*input_size"):
        adapt(timm_model).logits({"pixel_values": torch.randn(1, 3, 32, 32)}, torch.zeros(3, 16, 16))
    with pytest.raises(ValueError, match=r"δ has shape \(8,\)"):
        adapt(bert_model).logits({"input_ids": torch.tensor([[2, 3]])}, torch.zeros(8))


def test_device_mismatch_is_a_clear_error(timm_model):
    with pytest.raises(ValueError, match="same device|one device"):
        adapt(timm_model).check_delta(torch.zeros(1, 3, 16, 16), torch.zeros(3, 16, 16, device="meta"), 3)


def test_model_output_must_be_n_by_c():
    with pytest.raises(ValueError, match=r"expected logits of shape \(batch, num_classes\)"):
        adapt(nn.Flatten(0)).logits({"input": torch.randn(2, 3)})
    with pytest.raises(ValueError, match="declares 5 classes"):
        adapt(nn.Linear(3, 2), num_classes=5).logits({"input": torch.randn(2, 3)})


def test_calls_are_parsed_like_the_base(timm_model, bert_model):
    inputs, positional = adapt(timm_model).parse_call((torch.zeros(1, 3, 16, 16),), {})
    assert positional and set(inputs) == {"pixel_values"}
    inputs, positional = adapt(bert_model).parse_call((), {"input_ids": torch.tensor([[1]]), "attention_mask": torch.tensor([[1]])})
    assert not positional and set(inputs) == {"input_ids", "attention_mask"}
    with pytest.raises(TypeError, match="missing the model input"):
        adapt(timm_model).parse_call((), {})
    with pytest.raises(TypeError, match="either positionally or"):
        adapt(timm_model).parse_call((torch.zeros(1),), {"pixel_values": torch.zeros(1)})


def test_final_layer_is_the_classifier(timm_model, vit_model, bert_model):
    assert adapt(timm_model).final_layer() is timm_model.get_classifier()
    assert adapt(vit_model).final_layer() is vit_model.classifier
    assert adapt(bert_model).final_layer() is bert_model.classifier
