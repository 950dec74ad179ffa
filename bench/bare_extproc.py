"""The floor: a bare grpc.aio ext_proc server with no chain, asking for the same 4 phases as a
chain that reads answers and answering each message with a fixed response. `python -m bench.bare_extproc PORT CLUSTER`.

The benchmark runs it in place of the workers, so the difference to the chain with answers read
is what the chain itself costs, and the rest is gRPC's and Envoy's.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvloop
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

_PM = processing_mode_pb2.ProcessingMode


def _responses(cluster: str) -> dict[str, Any]:
    route = pb.CommonResponse(
        header_mutation=pb.HeaderMutation(
            set_headers=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key="x-ztgate-upstream", raw_value=cluster.encode())
                )
            ]
        ),
        clear_route_cache=True,
    )
    mode = _PM(
        request_body_mode=_PM.BUFFERED,
        response_header_mode=_PM.SEND,
        request_trailer_mode=_PM.SKIP,
        response_trailer_mode=_PM.SKIP,
    )
    resp_mode = _PM(
        request_body_mode=_PM.BUFFERED,
        response_header_mode=_PM.SEND,
        response_body_mode=_PM.BUFFERED,
        request_trailer_mode=_PM.SKIP,
        response_trailer_mode=_PM.SKIP,
    )
    return {
        "request_headers": pb.ProcessingResponse(request_headers=pb.HeadersResponse(), mode_override=mode),
        "request_body": pb.ProcessingResponse(request_body=pb.BodyResponse(response=route)),
        "response_headers": pb.ProcessingResponse(
            response_headers=pb.HeadersResponse(), mode_override=resp_mode
        ),
        "response_body": pb.ProcessingResponse(response_body=pb.BodyResponse()),
    }


async def _main(port: int, cluster: str) -> None:
    answers = _responses(cluster)

    async def process(requests: AsyncIterator[Any], _ctx: Any) -> AsyncIterator[Any]:
        async for req in requests:
            yield answers[req.WhichOneof("request")]

    server = grpc.aio.server()
    server.add_registered_method_handlers(
        "envoy.service.ext_proc.v3.ExternalProcessor",
        {
            "Process": grpc.stream_stream_rpc_method_handler(
                process,
                request_deserializer=pb.ProcessingRequest.FromString,
                response_serializer=pb.ProcessingResponse.SerializeToString,
            )
        },
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    uvloop.run(_main(int(sys.argv[1]), sys.argv[2]))
