"""Index and search: keep a vector store in sync with the change feed (issue 16).

``embedders`` turns chunk texts into vectors (offline ONNX MiniLM by default); nothing
here imports numpy, onnxruntime or a store until a function that needs it is called.
"""
