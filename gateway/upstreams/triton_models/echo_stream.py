"""Triton decoupled (streaming) model: streams `stream v<version>:` then the input word by word."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = args["model_version"]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode("utf-8")
            pieces = [f"stream v{self.version}:"] + [" " + w for w in text.split(" ")]
            for piece in pieces:
                if request.is_cancelled():
                    break
                out = pb_utils.Tensor("text_output", np.array([piece.encode()], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
