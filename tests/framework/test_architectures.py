"""The real architectures the planner and freezing are tested on, built offline with random weights."""

from __future__ import annotations

import pytest
import torch

from framework.architectures import BertClassifier, resnet18, small_bert, torchvision_available


def test_the_resnet18_copy_has_torchvisions_size_and_in_place_relus():
    model = resnet18(prefer_torchvision=False)
    # torchvision.models.resnet18(weights=None) has 11,689,512 parameters (its documentation's figure)
    assert sum(p.numel() for p in model.parameters()) == 11_689_512
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 1000)
    relus = [m for m in model.modules() if isinstance(m, torch.nn.ReLU)]
    assert relus and all(m.inplace for m in relus)


@pytest.mark.skipif(not torchvision_available(), reason="torchvision does not import beside this torch")
def test_the_resnet18_copy_matches_torchvision_name_for_name():
    import torchvision

    ours, theirs = resnet18(10, prefer_torchvision=False), torchvision.models.resnet18(weights=None, num_classes=10)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ours.eval()(x), theirs.eval()(x))


def test_resnet18_refuses_a_bad_class_count():
    with pytest.raises(ValueError, match=r"`num_classes` is 0, but must be an int >= 1"):
        resnet18(0)


def test_small_bert_is_a_seeded_huggingface_bert_behind_one_tensor_in():
    pytest.importorskip("transformers")
    a, b = small_bert(seed=3), small_bert(seed=3)
    assert type(a).__module__.startswith("transformers.")
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k
    model = BertClassifier(a, num_classes=3).eval()
    ids = torch.randint(1, 1000, (4, 16))
    ids[:, 12:] = 0  # padding
    logits = model(ids)
    assert logits.shape == (4, 3)
    # the mask is built from the padding: more padding at the end leaves the [CLS] logits as they were
    torch.testing.assert_close(model(ids[:, :12]), logits, atol=1e-5, rtol=1e-4)
