"""No config.pbtxt: the model declares its tensors, batches of up to 4 rows, and dynamic batching."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        if not config.as_dict().get("input"):
            config.add_input({"name": "ROWS", "data_type": "TYPE_FP32", "dims": [3]})
        if not config.as_dict().get("output"):
            config.add_output({"name": "MEANS", "data_type": "TYPE_FP32", "dims": [1]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "ROWS").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("MEANS", rows.mean(axis=1, keepdims=True))]))
        return responses
