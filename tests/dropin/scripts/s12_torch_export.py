# The PyTorch tutorial: export a model with a dynamic batch axis and check it with onnxruntime.
import os
import tempfile

import numpy as np
import torch

import onnxruntime


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return torch.softmax(self.fc(x), dim=1)


torch.manual_seed(0)
model = Net().eval()
x = torch.randn(2, 3, 16, 16)
path = os.path.join(tempfile.mkdtemp(), "net.onnx")
torch.onnx.export(model, (x,), path, input_names=["input"], output_names=["output"],
                  dynamic_axes={"input": {0: "batch_size"}, "output": {0: "batch_size"}}, opset_version=17,
                  dynamo=False)
ort_session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])


def to_numpy(tensor):
    return tensor.detach().cpu().numpy() if tensor.requires_grad else tensor.cpu().numpy()


for batch in (1, 2, 5):
    xb = torch.randn(batch, 3, 16, 16)
    ort_outs = ort_session.run(None, {ort_session.get_inputs()[0].name: to_numpy(xb)})
    with torch.no_grad():
        np.testing.assert_allclose(to_numpy(model(xb)), ort_outs[0], rtol=1e-03, atol=1e-05)
print(ort_session.get_inputs()[0].shape)
print("ok")
