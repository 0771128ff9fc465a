"""The registered MLflow model (saved, checked against ONNX, registered) and the inference server that serves it."""
