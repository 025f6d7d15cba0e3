"""Models for real formats: onnxruntime, torch, minilm, the demo."""
