"""Counts and adds up countdown's responses, read as they come from a decoupled BLS call."""

import numpy as np
import triton_python_backend_utils as pb_utils


def tally(answers):
    """(RESPONSES, TOTAL) of a decoupled call's responses; the first error ends it."""
    count = total = 0
    for answer in answers:
        if answer.has_error():
            return pb_utils.InferenceResponse(error=answer.error())
        if answer.output_tensors():  # the final flag may come alone, in an empty response
            count += 1
            total += int(pb_utils.get_output_tensor_by_name(answer, "LEFT").as_numpy()[0])
    return pb_utils.InferenceResponse([pb_utils.Tensor("RESPONSES", np.array([count], np.int32)),
                                       pb_utils.Tensor("TOTAL", np.array([total], np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        return [tally(pb_utils.InferenceRequest(model_name="countdown", requested_output_names=["LEFT"],
                                                inputs=[pb_utils.get_input_tensor_by_name(request, "N")]).exec(decoupled=True))
                for request in requests]
