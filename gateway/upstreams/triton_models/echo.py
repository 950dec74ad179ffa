"""Triton Python-backend text model: answers `echo v<version>: <input>` for every BYTES element."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = args["model_version"]

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            out = np.array(
                [f"echo v{self.version}: {t.decode('utf-8')}".encode() for t in texts.reshape(-1)], dtype=np.object_
            ).reshape(texts.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out)]))
        return responses
