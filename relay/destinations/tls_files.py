"""A broker destination's TLS context from the files it names: the CAs to trust and a client
certificate. Built when the worker starts, so that a file that is missing or not PEM is a
:class:`DestinationRefused` naming it, not a vague error at every attempt, and an encrypted key
is refused rather than asked for on the worker's terminal."""

from __future__ import annotations

import os
import ssl
import stat
from dataclasses import dataclass

from relay.destinations.errors import DestinationRefused, describe_error


@dataclass(frozen=True)
class TlsFiles:
    """``cafile``/``capath`` (else the system's CAs, and those of ``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR``), ``certfile`` and ``keyfile`` (a client certificate; the key may be in
    ``certfile``), and whether the server's certificate is verified."""

    cafile: str | None = None
    capath: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True

    def context(self) -> ssl.SSLContext:
        """The client context; :class:`DestinationRefused` naming the file that cannot be used."""
        for key, path in (("cafile", self.cafile), ("certfile", self.certfile)):
            _check_file(key, path)
        _check_file("keyfile", self.keyfile)
        if self.capath is not None and not os.path.isdir(self.capath):
            raise DestinationRefused(f"capath={self.capath!r} is not a directory")
        try:
            context = ssl.create_default_context(cafile=self.cafile, capath=self.capath)
        except (OSError, ValueError) as exc:
            named = (("cafile", self.cafile), ("capath", self.capath))
            where = " and ".join(f"{key}={value!r}" for key, value in named if value)
            raise DestinationRefused(
                f"cannot load the CA certificates of {where or 'the system'}: {describe_error(exc)}"
            ) from None
        if self.certfile:
            self._load_client_certificate(context, self.certfile)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def _load_client_certificate(self, context: ssl.SSLContext, certfile: str) -> None:
        try:
            context.load_cert_chain(certfile, self.keyfile, password=_no_password)
        except _EncryptedKey:
            where = f"keyfile={self.keyfile!r}" if self.keyfile else f"certfile={certfile!r}"
            raise DestinationRefused(
                f"the key in {where} is encrypted; give an unencrypted key"
            ) from None
        except (OSError, ValueError) as exc:
            files = f"certfile={certfile!r}" + (
                f" and keyfile={self.keyfile!r}" if self.keyfile else ""
            )
            raise DestinationRefused(
                f"cannot load the client certificate of {files}: "
                f"{_client_certificate_problem(certfile, self.keyfile, exc)}"
            ) from None


class TlsContext:
    """A destination's TLS context, built once from its files (``None``: no TLS): at start,
    where a refusal stops the worker, else at the first connection of a destination whose
    start was skipped, where a refusal is that attempt's failure."""

    def __init__(self, files: TlsFiles | None) -> None:
        self._files = files
        self._context: ssl.SSLContext | None = None

    def load(self) -> None:
        """Build the context now (at start); :class:`DestinationRefused` naming the file."""
        if self._files is not None:
            self._context = self._files.context()

    def for_connection(self, failure: type[Exception]) -> ssl.SSLContext | None:
        """The context, built now if it was not at start: a refusal raises ``failure`` (the
        client's own connection error, so that the attempt fails as for any other)."""
        if self._context is None and self._files is not None:
            try:
                self._context = self._files.context()
            except DestinationRefused as refused:
                raise failure(str(refused)) from None
        return self._context


MAX_FILE_BYTES = 4 * 1024 * 1024
"""Far above any certificate file (a system's whole CA bundle is about 200 kB): a larger one
would hold the worker's start for as long as it takes to read."""


def _check_file(key: str, path: str | None) -> None:
    """Refuse what is not a regular file of a certificate's size: a named pipe or a device
    would block the worker's start (reading waits for a writer), unstoppable."""
    if path is None:
        return
    try:
        found = os.stat(path)
    except OSError as exc:
        raise DestinationRefused(f"cannot use {key}={path!r}: {describe_error(exc)}") from None
    if not stat.S_ISREG(found.st_mode):
        raise DestinationRefused(f"{key}={path!r} is not a regular file")
    if found.st_size > MAX_FILE_BYTES:
        raise DestinationRefused(
            f"{key}={path!r} is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB: "
            "not a certificate file"
        )


PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
PEM_PRIVATE_KEY = b"PRIVATE KEY-----"
"""The end of the header of every PEM private key (``PRIVATE KEY``, ``RSA PRIVATE KEY``, ...)."""


def _client_certificate_problem(certfile: str, keyfile: str | None, exc: Exception) -> str:
    """What is wrong with a client certificate and key OpenSSL refused, in words: OpenSSL only
    says "PEM lib" for a file without the certificate or the key it should hold."""
    if isinstance(exc, ssl.SSLError):
        if exc.reason == "KEY_VALUES_MISMATCH":
            return "the key is not the certificate's"
        if PEM_CERTIFICATE not in _content(certfile):
            return "the certfile holds no PEM certificate"
        if PEM_PRIVATE_KEY not in _content(keyfile or certfile):
            return (
                "the keyfile holds no PEM private key"
                if keyfile
                else "the certfile holds no PEM private key (or give keyfile)"
            )
    return describe_error(exc)


def _content(path: str) -> bytes:
    """The file's content (it was checked to be a regular file of at most MAX_FILE_BYTES)."""
    try:
        with open(path, "rb") as file:
            return file.read(MAX_FILE_BYTES)
    except OSError:
        return b""


class _EncryptedKey(Exception):
    """A client key that needs a password, which the settings cannot give."""


def _no_password() -> str:
    raise _EncryptedKey
