"""A synchronous BLS call to the model the request names; its error becomes this request's error."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
            call = pb_utils.InferenceRequest(
                model_name=target, requested_output_names=["SUM", "PRODUCT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, name) for name in ("A", "B")])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{target} refused the call: {answer.error().message()}")))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
