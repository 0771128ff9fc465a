"""The serving extra's tests: the registered model (MLflow pyfunc, no torch), the inference server, scoring, ONNX
export."""
