"""Real architectures with random weights, built offline: ResNet-18 and a small BERT.

The planner and layer freezing are tested and measured on these (nothing is downloaded):

- `resnet18(num_classes)`: `torchvision.models.resnet18(weights=None)` when torchvision imports, else this module's
  copy of it, with the same modules, names, shapes and in-place ReLUs (`tests/framework/test_architectures.py`
  compares the two where torchvision is installed). PyPI's torchvision wheels are CUDA builds that do not import
  beside a CPU-only torch, hence the copy.
- `small_bert(...)`: `transformers.BertModel(BertConfig(...))` of a small size (the `models` extra), and
  `BertClassifier`, a module with one tensor in (token ids) and logits out around it, so a BERT plugs into code that
  expects `model(x) -> tensor`.

Pure torch (and transformers where asked for); no Ray.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["BasicBlock", "BertClassifier", "ResNet", "resnet18", "small_bert", "torchvision_available"]


def torchvision_available() -> bool:
    """Whether `import torchvision` works (its compiled ops load beside this torch)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # ImportError, or RuntimeError from a torchvision built for another torch
        return False
    return True


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: two 3x3 convolutions with batch norm, a residual add, in-place ReLUs."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ResNet (BasicBlock variant), same attribute names and initialisation."""

    def __init__(self, layers: tuple[int, int, int, int] = (2, 2, 2, 2), num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000, *, prefer_torchvision: bool = True) -> nn.Module:
    """A ResNet-18 with random weights: torchvision's when it imports (and `prefer_torchvision`), else the copy here.

    Args:
        num_classes: outputs of the final `fc` layer.
        prefer_torchvision: False always builds this module's copy (the same architecture).
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"`num_classes` is {num_classes!r}, but must be an int >= 1")
    if prefer_torchvision and torchvision_available():
        import torchvision

        return torchvision.models.resnet18(weights=None, num_classes=num_classes)
    return ResNet((2, 2, 2, 2), num_classes=num_classes)


def small_bert(
    hidden_size: int = 64, num_layers: int = 2, num_heads: int = 2, vocab_size: int = 1000, max_len: int = 64,
    seed: int | None = 0, **config: Any,
) -> nn.Module:
    """`transformers.BertModel(BertConfig(...))` of a small size with random weights (seeded when `seed` is not
    None). Needs the `models` extra (`pip install 'modelhopper[models]'`)."""
    try:
        from transformers import BertConfig, BertModel
    except ImportError as e:
        raise ImportError(f"small_bert needs transformers ({e}): pip install 'modelhopper[models]'") from e
    cfg = BertConfig(hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
                     intermediate_size=4 * hidden_size, vocab_size=vocab_size, max_position_embeddings=max_len,
                     **config)
    if seed is None:
        return BertModel(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return BertModel(cfg)


class BertClassifier(nn.Module):
    """A BERT with a linear head on its [CLS] vector: `model(token_ids) -> logits`. The attention mask is
    `token_ids != pad_id`; the BERT's several inputs and its `ModelOutput` stay inside."""

    def __init__(self, bert: nn.Module, num_classes: int, pad_id: int = 0) -> None:
        super().__init__()
        self.bert, self.pad_id = bert, pad_id
        self.head = nn.Linear(bert.config.hidden_size, num_classes)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        out = self.bert(input_ids=token_ids, attention_mask=(token_ids != self.pad_id).long())
        return self.head(out.last_hidden_state[:, 0])
