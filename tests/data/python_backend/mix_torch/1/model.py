"""mix's contract, computed by a torch module the python model holds."""

import torch
import triton_python_backend_utils as pb_utils


class Mix(torch.nn.Module):
    def forward(self, a, b):
        return a + b, a * b


class TritonPythonModel:
    def initialize(self, args):
        self.module = Mix().eval()

    def execute(self, requests):
        responses = []
        for request in requests:
            a, b = (torch.from_numpy(pb_utils.get_input_tensor_by_name(request, name).as_numpy()) for name in "AB")
            with torch.inference_mode():
                total, product = self.module(a, b)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", total.numpy()), pb_utils.Tensor("PRODUCT", product.numpy())]))
        return responses
