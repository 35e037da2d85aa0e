# The version of lockstep: of this package, the CLI and the daemons. The one
# place it is written; CMakeLists.txt reads it for project(VERSION).
__version__ = "0.9.0"
