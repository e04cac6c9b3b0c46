"""No config.pbtxt: the model declares its own tensors, and no batching."""

import numpy as np
import triton_python_backend_utils as pb_utils

TENSORS = {"input": [{"name": "WORDS", "data_type": "TYPE_STRING", "dims": [-1]}],
           "output": [{"name": "LENGTHS", "data_type": "TYPE_INT32", "dims": [-1]}]}


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        declared = config.as_dict()
        for kind, add in (("input", config.add_input), ("output", config.add_output)):
            have = {tensor["name"] for tensor in declared.get(kind, [])}
            for tensor in TENSORS[kind]:
                if tensor["name"] not in have:
                    add(tensor)
        config.set_max_batch_size(0)
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            words = pb_utils.get_input_tensor_by_name(request, "WORDS").as_numpy()
            lengths = np.array([len(word) for word in words], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LENGTHS", lengths)]))
        return responses
