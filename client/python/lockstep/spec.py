"""Job specs from Python: a dict, a JSON file or a JobSpec message, with
overrides, parsed as the CLI parses them (common/job_spec.cc)."""
import copy
import json
import os

from google.protobuf import json_format

from lockstep.errors import InvalidArgument
from lockstep.v1 import job_pb2

# A job spec is a few KiB; the CLI's own reader is bounded too.
_MAX_SPEC_BYTES = 4 << 20

_REFERENCE = ' (the fields are listed in README.md, "Job spec reference")'


def _set_path(tree, dotted, value, origin):
    keys = dotted.split(".")
    if not all(keys):
        raise InvalidArgument("override %r is not a field path (like "
                              "epochs or communication.algorithm)" % dotted)
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise InvalidArgument("override %s: %s in %s is not an object"
                                  % (dotted, key, origin))
        node = child
    node[keys[-1]] = value


def _as_dict(spec):
    """(a deep copy of the spec as a JSON dict, where it came from)."""
    if isinstance(spec, job_pb2.JobSpec):
        return (json_format.MessageToDict(spec, preserving_proto_field_name=True),
                "the JobSpec")
    if isinstance(spec, dict):
        return copy.deepcopy(spec), "the job spec"
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_SPEC_BYTES + 1)
        except OSError as error:
            raise InvalidArgument("cannot read the job spec %s: %s"
                                  % (path, error.strerror)) from None
        if len(data) > _MAX_SPEC_BYTES:
            raise InvalidArgument("the job spec %s is over %d bytes"
                                  % (path, _MAX_SPEC_BYTES))
        try:
            tree = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            raise InvalidArgument("%s is not JSON: %s" % (path, error)) from None
        if not isinstance(tree, dict):
            raise InvalidArgument("%s: a job spec is a JSON object" % path)
        return tree, path
    raise InvalidArgument("a job spec is a dict, a path to a JSON file or a "
                          "JobSpec, not %s" % type(spec).__name__)


def job_spec(spec, overrides=None):
    """The JobSpec of `spec` (a dict, a path or a JobSpec) with `overrides`
    applied: {"epochs": 1, "communication.algorithm": "ring"}, dotted paths
    into the spec as the CLI's --set takes them. "model": "cnn" is short for
    "model": {"name": "cnn"}. Raises InvalidArgument naming the field."""
    tree, origin = _as_dict(spec)
    # The shorthand before the overrides (model.dropout on "model": "cnn")
    # and after them (an override "model": "cnn").
    for path, value in [(None, None)] + list((overrides or {}).items()):
        if isinstance(tree.get("model"), str):
            tree["model"] = {"name": tree["model"]}
        if path is not None:
            _set_path(tree, path, value, origin)
    if isinstance(tree.get("model"), str):
        tree["model"] = {"name": tree["model"]}
    message = job_pb2.JobSpec()
    try:
        json_format.ParseDict(tree, message)
    except json_format.ParseError as error:
        raise InvalidArgument("%s: %s%s" % (origin, error, _REFERENCE)) from None
    return message


def keyword_overrides(kwargs):
    """submit()'s keyword overrides as dotted paths: a double underscore
    nests (communication__algorithm="ring")."""
    return {key.replace("__", "."): value for key, value in kwargs.items()}
