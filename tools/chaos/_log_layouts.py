"""The two log layouts every log fault runs on: ``packed`` (one pack file an array) and ``chunked`` (one
file a chunk, lz4), both with tiny chunks so that a few dozen events span many chunks and every boundary
(a chunk, a block reservation, a commit) is crossed often."""

from __future__ import annotations

from storage import StorageConfig

TINY = dict(routing_chunk_bytes=1024, vector_chunk_bytes=1024, header_chunk_bytes=1024, cache_chunks=4,
            readahead_chunks=3, read_block_bytes=4096, reserve_min_bytes=128)
LAYOUTS = {"packed": StorageConfig(**TINY), "chunked": StorageConfig(**TINY, codec="lz4")}
