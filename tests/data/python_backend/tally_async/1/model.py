"""tally's work with the decoupled BLS call awaited: the responses arrive once countdown has sent its last."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(model_name="countdown", requested_output_names=["LEFT"],
                                             inputs=[pb_utils.get_input_tensor_by_name(request, "N")])
            answers = [answer for answer in await call.async_exec(decoupled=True) if answer.output_tensors()]
            values = [int(pb_utils.get_output_tensor_by_name(answer, "LEFT").as_numpy()[0]) for answer in answers]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESPONSES", np.array([len(values)], np.int32)),
                                                         pb_utils.Tensor("TOTAL", np.array([sum(values)], np.int32))]))
        return responses
