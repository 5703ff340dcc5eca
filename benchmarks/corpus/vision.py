"""Convolutional families in torchvision's layouts, written out in plain torch: ResNet-50
(bottlenecks), MobileNetV3-large (hardswish, squeeze-excite with hardsigmoid), EfficientNet-B0
(SiLU, squeeze-excite) and ConvNeXt-tiny (7x7 depthwise, channels-last LayerNorm, layer scale).

``builder(path, size, *, exporter, opset, dynamic, batch)``: 224 x 224 inputs (64 x 64 and
narrower stages at ``size="tiny"``); ``dynamic`` makes the batch axis symbolic.
"""

from __future__ import annotations

import numpy as np

from ._export import export, randomize_bn


def _finish(m, path, size, *, exporter, opset, dynamic, batch):
    import torch

    randomize_bn(m)
    img = 224 if size != "tiny" else 64
    batch = batch if size != "tiny" else min(batch, 2)
    x = np.random.default_rng(0).standard_normal((batch, 3, img, img)).astype(np.float32)
    axes = {"x": {0: "batch"}, "logits": {0: "batch"}} if dynamic else None
    export(m, (torch.from_numpy(x),), path, inputs=["x"], outputs=["logits"], exporter=exporter, opset=opset,
           dynamic=axes)
    return {"x": x}


def _classes(size):
    return 1000 if size != "tiny" else 10


def resnet50(path, size, **kw):
    """torchvision's resnet50: bottleneck blocks (1x1, 3x3 with the stride, 1x1 x4), [3, 4, 6, 3]."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = mid * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
            self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
            self.conv3, self.bn3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    width, depths = (64, (3, 4, 6, 3)) if size != "tiny" else (8, (1, 1, 1, 1))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], width
            for i, n in enumerate(depths):
                mid = width * 2 ** i
                for j in range(n):
                    blocks.append(Bottleneck(cin, mid, 2 if (j == 0 and i > 0) else 1))
                    cin = mid * 4
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, _classes(size))

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))

    torch.manual_seed(0)
    return _finish(ResNet(), path, size, **kw)


def _make_divisible(v, divisor=8):
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _squeeze_excite(nn, c, squeeze, act, gate):
    class SE(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)

        def forward(self, x):
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            return x * gate(self.fc2(act(self.fc1(s))))

    return SE()


def mobilenet_v3(path, size, **kw):
    """torchvision's mobilenet_v3_large: inverted residuals with ReLU or hardswish, squeeze-excite
    (ReLU, hardsigmoid) in the marked blocks, a hardswish head."""
    import torch
    from torch import nn

    # kernel, expanded, out, SE, activation, stride
    cfg = [(3, 16, 16, 0, "RE", 1), (3, 64, 24, 0, "RE", 2), (3, 72, 24, 0, "RE", 1), (5, 72, 40, 1, "RE", 2),
           (5, 120, 40, 1, "RE", 1), (5, 120, 40, 1, "RE", 1), (3, 240, 80, 0, "HS", 2), (3, 200, 80, 0, "HS", 1),
           (3, 184, 80, 0, "HS", 1), (3, 184, 80, 0, "HS", 1), (3, 480, 112, 1, "HS", 1), (3, 672, 112, 1, "HS", 1),
           (5, 672, 160, 1, "HS", 2), (5, 960, 160, 1, "HS", 1), (5, 960, 160, 1, "HS", 1)]
    scale = 1.0 if size != "tiny" else 0.25
    if size == "tiny":
        cfg = cfg[:1] + cfg[3:4] + cfg[6:7] + cfg[10:11]

    def cbn(cin, cout, k, s, groups=1, act=None):
        layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act:
            layers.append(nn.Hardswish() if act == "HS" else nn.ReLU())
        return nn.Sequential(*layers)

    class Block(nn.Module):
        def __init__(self, cin, k, exp, cout, se, act, s):
            super().__init__()
            layers = [] if exp == cin else [cbn(cin, exp, 1, 1, act=act)]
            layers.append(cbn(exp, exp, k, s, groups=exp, act=act))
            if se:
                layers.append(_squeeze_excite(nn, exp, _make_divisible(exp // 4), nn.functional.relu,
                                              nn.functional.hardsigmoid))
            layers.append(cbn(exp, cout, 1, 1))
            self.body = nn.Sequential(*layers)
            self.res = s == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.res else self.body(x)

    class MobileNetV3(nn.Module):
        def __init__(self):
            super().__init__()
            cin = _make_divisible(16 * scale)
            layers = [cbn(3, cin, 3, 2, act="HS")]
            for k, exp, cout, se, act, s in cfg:
                exp, cout = _make_divisible(exp * scale), _make_divisible(cout * scale)
                layers.append(Block(cin, k, exp, cout, se, act, s))
                cin = cout
            last = 6 * cin
            layers.append(cbn(cin, last, 1, 1, act="HS"))
            self.features = nn.Sequential(*layers)
            hidden = 1280 if size != "tiny" else 64
            self.classifier = nn.Sequential(nn.Linear(last, hidden), nn.Hardswish(), nn.Linear(hidden, _classes(size)))

        def forward(self, x):
            return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    torch.manual_seed(0)
    return _finish(MobileNetV3(), path, size, **kw)


def efficientnet_b0(path, size, **kw):
    """torchvision's efficientnet_b0: MBConv blocks (expand 1x1, depthwise 3x3/5x5, squeeze-excite
    with SiLU and sigmoid, project 1x1) with SiLU throughout, a 1280-wide head."""
    import torch
    from torch import nn

    # expand ratio, kernel, stride, in, out, layers
    cfg = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
           (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    if size == "tiny":
        cfg = [(e, k, s, max(8, cin // 4), max(8, cout // 4), 1) for e, k, s, cin, cout, _ in cfg[:4]]

    def cbs(cin, cout, k, s, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        if act:
            layers.append(nn.SiLU())
        return nn.Sequential(*layers)

    class MBConv(nn.Module):
        def __init__(self, e, k, s, cin, cout):
            super().__init__()
            exp = cin * e
            layers = [] if e == 1 else [cbs(cin, exp, 1, 1)]
            layers += [cbs(exp, exp, k, s, groups=exp),
                       _squeeze_excite(nn, exp, max(1, cin // 4), nn.functional.silu, torch.sigmoid),
                       cbs(exp, cout, 1, 1, act=False)]
            self.block = nn.Sequential(*layers)
            self.res = s == 1 and cin == cout

        def forward(self, x):
            return x + self.block(x) if self.res else self.block(x)

    class EfficientNet(nn.Module):
        def __init__(self):
            super().__init__()
            first = cfg[0][3]
            layers = [cbs(3, first, 3, 2)]
            for e, k, s, cin, cout, n in cfg:
                for i in range(n):
                    layers.append(MBConv(e, k, s if i == 0 else 1, cin if i == 0 else cout, cout))
            head = 1280 if size != "tiny" else 64
            layers.append(cbs(cfg[-1][4], head, 1, 1))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(head, _classes(size))

        def forward(self, x):
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    torch.manual_seed(0)
    return _finish(EfficientNet(), path, size, **kw)


def convnext_tiny(path, size, **kw):
    """torchvision's convnext_tiny: 4x4 stride-4 stem + LayerNorm2d, blocks of 7x7 depthwise conv,
    channels-last LayerNorm, Linear 4x, GELU, Linear, layer scale, residual; LayerNorm2d + 2x2
    stride-2 downsampling; [3, 3, 9, 3] x (96, 192, 384, 768)."""
    import torch
    from torch import nn

    dims, depths = ((96, 192, 384, 768), (3, 3, 9, 3)) if size != "tiny" else ((16, 32, 48, 64), (1, 1, 1, 1))

    class LayerNorm2d(nn.LayerNorm):
        def forward(self, x):
            return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
            self.norm = nn.LayerNorm(d, eps=1e-6)
            self.pw1, self.pw2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            # trained layer scales are far from their 1e-6 start; random ones keep blocks visible
            self.layer_scale = nn.Parameter(torch.rand(d, 1, 1) * 0.5 + 0.1)

        def forward(self, x):
            y = self.norm(self.dw(x).permute(0, 2, 3, 1))
            y = self.pw2(nn.functional.gelu(self.pw1(y))).permute(0, 3, 1, 2)
            return x + self.layer_scale * y

    class ConvNeXt(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))]
            for i, (d, n) in enumerate(zip(dims, depths)):
                if i:
                    layers.append(nn.Sequential(LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], d, 2, 2)))
                layers += [Block(d) for _ in range(n)]
            self.features = nn.Sequential(*layers)
            self.norm = LayerNorm2d(dims[-1], eps=1e-6)
            self.fc = nn.Linear(dims[-1], _classes(size))

        def forward(self, x):
            y = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.fc(torch.flatten(self.norm(y), 1))

    torch.manual_seed(0)
    return _finish(ConvNeXt(), path, size, **kw)
