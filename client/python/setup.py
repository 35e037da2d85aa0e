"""Builds the lockstep package: setuptools (pyproject.toml says the rest)
with one more step, the gRPC stubs and their type stubs (.pyi) generated
from the repository's proto/ folder into the build, as CMakeLists.txt
generates them into build/python."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))
PROTOS = ["lockstep/v1/cluster.proto", "lockstep/v1/job.proto",
          "lockstep/v1/checkpoint.proto", "lockstep/v1/coordinator.proto"]


class BuildWithStubs(build_py):
    """build_py, then protoc into the build folder."""

    def run(self):
        super().run()
        protoc = shutil.which("protoc")
        plugin = shutil.which("grpc_python_plugin")
        if not protoc or not plugin:
            raise SystemExit(
                "lockstep: building the package needs protoc and "
                "grpc_python_plugin on PATH (Debian: apt-get install "
                "protobuf-compiler protobuf-compiler-grpc)")
        missing = [name for name in PROTOS
                   if not os.path.isfile(os.path.join(PROTO_DIR, name))]
        if missing:
            raise SystemExit(
                "lockstep: %s not found under %s: build the package from the "
                "repository (pip install client/python), not from a copy of "
                "client/python alone" % (", ".join(missing), PROTO_DIR))
        out = self.build_lib
        os.makedirs(os.path.join(out, "lockstep", "v1"), exist_ok=True)
        subprocess.run(
            [protoc, "--proto_path=" + PROTO_DIR, "--python_out=" + out,
             "--pyi_out=" + out, "--grpc_python_out=" + out,
             "--plugin=protoc-gen-grpc_python=" + plugin] +
            [os.path.join(PROTO_DIR, name) for name in PROTOS], check=True)
        with open(os.path.join(out, "lockstep", "v1", "__init__.py"), "a",
                  encoding="utf-8"):
            pass


setup(cmdclass={"build_py": BuildWithStubs})
