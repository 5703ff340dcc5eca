"""BERT-base-sized encoder (12 x 768, seq 128, batch 1): runtime-core vs onnxruntime in one process.

Both at 2 intra-op threads, interleaved runs, median of 15. Run: python benchmarks/bert_base.py
(onnxruntime and torch are benchmark-only dependencies).
"""
import io, time, warnings, numpy as np, torch, onnxruntime as ort
import runtime_core as rt
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True, activation="gelu")
enc = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).eval()
x = torch.randn(1, 128, 768)
b = io.BytesIO()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(enc, (x,), b, dynamo=False, opset_version=17)
data = b.getvalue()
so = ort.SessionOptions(); so.intra_op_num_threads = 2
s_ort = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
ro = rt.SessionOptions(); ro.intra_op_num_threads = 2
t0 = time.perf_counter(); s_rt = rt.InferenceSession(data, ro, providers=["cpu"]); t_create = time.perf_counter() - t0
feeds = {s_ort.get_inputs()[0].name: x.numpy()}
s_rt.run(None, feeds); s_ort.run(None, feeds)
a, o = [], []
for _ in range(15):
    t = time.perf_counter(); s_rt.run(None, feeds); a.append(time.perf_counter() - t)
    t = time.perf_counter(); s_ort.run(None, feeds); o.append(time.perf_counter() - t)
ma, mo = np.median(a) * 1e3, np.median(o) * 1e3
print(f"BERT-base-sized (12x768, seq128, b1): ours {ma:.1f} ms, onnxruntime {mo:.1f} ms, ratio {ma/mo:.2f}; session creation {t_create:.2f} s; nodes {len(s_rt.get_partition_report().nodes)}")
np.testing.assert_allclose(s_rt.run(None, feeds)[0], s_ort.run(None, feeds)[0], rtol=1e-3, atol=1e-3)
