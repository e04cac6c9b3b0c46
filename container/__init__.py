"""Multi-model PyTorch inference server: SageMaker multi-model contract, Triton V2 and TF Serving REST."""
