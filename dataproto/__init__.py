"""ppoflow's batch protocol: ``from dataproto import DataProto`` replaces ``from verl import DataProto``.

>>> import torch
>>> from dataproto import DataProto
>>> len(DataProto.from_dict({"x": torch.zeros(3)}))
3
"""

from dataproto.artifact import (
    ArtifactError,
    ArtifactRef,
    ArtifactTypeError,
    artifact_ref,
    load_artifact,
    read_manifest,
    save_artifact,
    verify_artifact,
)
from dataproto.equality import (
    dataproto_equal,
    deep_equal,
    list_of_dict_to_dict_of_list,
    loose_equal,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)
from dataproto.errors import DataProtoKeyError, DataProtoTypeError, DataProtoValueError
from dataproto.item import DataProtoItem
from dataproto.iteration import collate_fn
from dataproto.ledger import TokenLedger, ledger_from_batch, ledger_from_params
from dataproto.padding import DataProtoConfig, pad_dataproto_to_divisor, unpad_dataproto
from dataproto.protocol import DataProto
from dataproto.report import describe_artifact
from dataproto.reshape import fold_batch_dim, unfold_batch_dim
from dataproto.sample_batch import make_sample_batch
from dataproto.schema import KeySchema, format_schema, schema_from_json, schema_of, schema_to_json

__all__ = [
    "ArtifactError",
    "ArtifactRef",
    "ArtifactTypeError",
    "DataProto",
    "DataProtoConfig",
    "DataProtoItem",
    "DataProtoKeyError",
    "DataProtoTypeError",
    "DataProtoValueError",
    "KeySchema",
    "TokenLedger",
    "artifact_ref",
    "collate_fn",
    "dataproto_equal",
    "deep_equal",
    "describe_artifact",
    "fold_batch_dim",
    "format_schema",
    "ledger_from_batch",
    "ledger_from_params",
    "list_of_dict_to_dict_of_list",
    "load_artifact",
    "loose_equal",
    "make_sample_batch",
    "pad_dataproto_to_divisor",
    "read_manifest",
    "save_artifact",
    "schema_from_json",
    "schema_of",
    "schema_to_json",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
    "verify_artifact",
]
