"""mix's contract, each array changed in place: an input read through DLPack into torch, an input's
numpy array multiplied into, and the answer of a BLS call to `mix` clipped where it lies."""

import json

import numpy as np
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.limit = float(json.loads(args["model_config"])["parameters"]["LIMIT"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a, b = (pb_utils.get_input_tensor_by_name(request, name) for name in "AB")
            answer = pb_utils.InferenceRequest(model_name="mix", requested_output_names=["SUM"], inputs=[a, b]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            total = pb_utils.get_output_tensor_by_name(answer, "SUM").as_numpy()
            np.minimum(total, self.limit, out=total)
            product = a.as_numpy()
            product *= torch.utils.dlpack.from_dlpack(b.to_dlpack()).numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", total), pb_utils.Tensor("PRODUCT", product)]))
        return responses
