"""The sharded, resumable data loader (docs/training.md, "Data loader").

- `ShardedLoader(source, global_batch, model=...)`: global batches in a seeded per-epoch order,
  each process reading its part (`part="rank"`) or the global batch that `train_step` takes
  (`part="global"`, the default); its position is saved with the checkpoint
  (`save_checkpoint(..., extra_state={"data": loader})`) and resumes at any data-parallel size.
- `TokenFile(path, seq_len)`: a flat file of token ids packed into samples of `seq_len + 1`
  tokens (inputs and next-token labels).
- `DataShard`: the data-parallel size and the block of the batch a process holds.
"""
from mindspore_hyper.data.data_shard import DataShard
from mindspore_hyper.data.loader import ShardedLoader
from mindspore_hyper.data.order import SampleOrder
from mindspore_hyper.data.sources import RandomAccessSource, StreamSource, as_source
from mindspore_hyper.data.state import LoaderState
from mindspore_hyper.data.token_file import TokenFile

__all__ = ["ShardedLoader", "TokenFile", "DataShard", "SampleOrder", "LoaderState", "RandomAccessSource",
           "StreamSource", "as_source"]
