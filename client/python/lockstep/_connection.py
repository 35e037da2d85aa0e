"""The channel to a coordinator: its address and mutual-TLS files from the
arguments or from the CLI's environment variables, and the check that the
server is a lockstep coordinator (as the CLI makes, common/tls.cc)."""
import os
import shutil
import socket
import ssl
import tempfile
import weakref

import grpc

from lockstep.errors import InvalidArgument, Unauthenticated, Unavailable

# The CLI's limit (common/rpc_limits.h): 4 MiB of payload plus framing.
MAX_MESSAGE_BYTES = (4 << 20) + (64 << 10)
# TLS files are a few KiB; a larger one is not a certificate.
_MAX_PEM_BYTES = 1 << 20


def _env(name):
    value = os.environ.get(name, "")
    return value or None


def _read_pem(what, path):
    """The PEM data of `path`, or `path` itself when it is bytes (the PEM
    data given directly)."""
    if isinstance(path, (bytes, bytearray)):
        data = bytes(path)
        if len(data) > _MAX_PEM_BYTES or b"-----BEGIN" not in data:
            raise InvalidArgument("the %s given as bytes is not PEM data"
                                  % what)
        return data
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_PEM_BYTES + 1)
    except OSError as error:
        raise InvalidArgument("cannot read the %s file %s: %s"
                              % (what, path, error.strerror)) from None
    if len(data) > _MAX_PEM_BYTES or b"-----BEGIN" not in data:
        raise InvalidArgument("%s: %s is not a PEM file" % (what, path))
    return data


def split_address(address):
    """(host, port) of "HOST:PORT" or "[V6]:PORT"."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(
            "the coordinator address %r is not HOST:PORT" % address)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class Settings:
    """Where the coordinator is and how to reach it."""

    def __init__(self, address=None, cert=None, key=None, ca=None,
                 insecure=None):
        self.address = address or _env("LOCKSTEP_COORDINATOR")
        if not self.address:
            raise InvalidArgument(
                "no coordinator address: pass address= (HOST:PORT) or set "
                "LOCKSTEP_COORDINATOR")
        split_address(self.address)
        if insecure is None:
            insecure = os.environ.get("LOCKSTEP_INSECURE", "") in ("1", "true")
        self.insecure = bool(insecure)
        # Each a path, or the PEM data itself as bytes.
        self._files = None
        self._folder = None
        self.cert = cert or _env("LOCKSTEP_TLS_CERT")
        self.key = key or _env("LOCKSTEP_TLS_KEY")
        self.ca = ca or _env("LOCKSTEP_TLS_CA")
        if self.insecure:
            return
        missing = [name for name, value in (
            ("cert (LOCKSTEP_TLS_CERT)", self.cert),
            ("key (LOCKSTEP_TLS_KEY)", self.key),
            ("ca (LOCKSTEP_TLS_CA)", self.ca)) if not value]
        if missing:
            raise InvalidArgument(
                "mutual TLS needs a certificate, its key and the cluster's "
                "CA; missing: %s (or insecure=True / LOCKSTEP_INSECURE=1 for "
                "a coordinator run with --insecure)" % ", ".join(missing))

    def channel(self, aio=False):
        """A channel to the coordinator: grpc's, or with aio=True
        grpc.aio's (made inside a running event loop)."""
        module = grpc.aio if aio else grpc
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        if self.insecure:
            return module.insecure_channel(self.address, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read_pem("CA", self.ca),
            private_key=_read_pem("key", self.key),
            certificate_chain=_read_pem("certificate", self.cert))
        return module.secure_channel(self.address, credentials,
                                     options=options)

    def check_server(self, timeout):
        """Raises unless the server at the address presents the
        coordinator's SPIFFE ID (spiffe://DOMAIN/coordinator) in a
        certificate of the CA that names the host dialed. gRPC's Python
        credentials check the chain and the host name but not the identity,
        so this handshake is made once, with Python's ssl, before any call.
        """
        if self.insecure:
            return
        host, port = split_address(self.address)
        try:
            context = ssl.create_default_context(
                cadata=_read_pem("CA", self.ca).decode("ascii", "replace"))
        except ssl.SSLError as error:
            raise InvalidArgument("cannot load the CA %s: %s"
                                  % (_name(self.ca), error)) from None
        try:
            cert, key = self._key_files()
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as error:
            raise InvalidArgument("cannot load the certificate %s with its key: "
                                  "%s" % (_name(self.cert), error)) from None
        context.set_alpn_protocols(["h2"])
        try:
            with socket.create_connection((host, port), timeout=timeout) as raw:
                with context.wrap_socket(raw, server_hostname=host) as tls:
                    peer = tls.getpeercert()
        except ssl.SSLError as error:
            raise Unavailable(
                "the TLS handshake with the coordinator at %s failed (%s): "
                "its certificate must come from the CA %s and name the host "
                "dialed" % (self.address, error, _name(self.ca)),
                "UNAVAILABLE") from None
        except OSError as error:
            raise Unavailable(
                "cannot reach the lockstep coordinator at %s (%s): is it "
                "running, and is the address right (LOCKSTEP_COORDINATOR)?"
                % (self.address, error.strerror or error), "UNAVAILABLE") from None
        uris = [value for kind, value in peer.get("subjectAltName", ())
                if kind == "URI"]
        if len(uris) != 1 or not _is_coordinator(uris[0]):
            raise Unauthenticated(
                "the server at %s presented %s, not the coordinator's "
                "(spiffe://DOMAIN/coordinator) identity: refusing to talk to "
                "it. Check the address, or that the server runs with a "
                "certificate made for its role (lockstep-certs)"
                % (self.address, ", ".join(uris) or "no SPIFFE ID"))


    def _key_files(self):
        """The certificate and key as files for Python's ssl, which loads
        them from files only: the paths given, or for PEM bytes private
        copies (mode 0600 in a folder of mode 0700), removed when these
        Settings are."""
        if self._files is None:
            files = []
            for what, value in (("certificate", self.cert), ("key", self.key)):
                if not isinstance(value, (bytes, bytearray)):
                    files.append(value)
                    continue
                if self._folder is None:
                    self._folder = tempfile.mkdtemp(prefix="lockstep-tls-")
                    weakref.finalize(self, shutil.rmtree, self._folder, True)
                path = os.path.join(self._folder, what + ".pem")
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT |
                                       os.O_EXCL, 0o600), "wb") as out:
                    out.write(_read_pem(what, value))
                files.append(path)
            self._files = tuple(files)
        return self._files


def _name(value):
    """How an error names a PEM source: its path, or that it was bytes."""
    return "(given as bytes)" if isinstance(value, (bytes, bytearray)) else value


def _is_coordinator(uri):
    prefix = "spiffe://"
    if not uri.startswith(prefix):
        return False
    parts = uri[len(prefix):].split("/")
    # As common/caller.cc reads it: the trust domain, then the role.
    return len(parts) >= 2 and all(parts) and parts[1] == "coordinator"
