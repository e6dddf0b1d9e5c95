"""What a cubin (the ELF that NVRTC produces) says about the candidate's kernels, read on the CPU.

- entry kernels (symbols with STO_CUDA_ENTRY) and undefined functions the code calls (`vprintf`, `malloc`, ...);
- static `__device__` / `__managed__` memory in 64 bits: ptxas records a section size modulo 2^32 (a 4 GiB + 64 B
  array shows as 64 bytes), so each section counts as far as its largest symbol reaches (symbol sizes are 64-bit);
- per kernel, from its `.nv.info.<name>` section: the parameter list the compiled code really has
  (EIATTR_KPARAM_INFO: ordinal, offset and size of every parameter; EIATTR_CBANK_PARAM_SIZE: their total);
- per kernel, from the global `.nv.info` section: local memory per thread (EIATTR_FRAME_SIZE, MIN/MAX_STACK_SIZE).

The `.nv.info` layout (4-byte entries: format, attribute, then a 16-bit value, or a 16-bit size and that many
bytes) is the one cuobjdump -elf prints; the same for NVRTC 12.x and 13.x cubins.
"""

from __future__ import annotations

import dataclasses
import struct

SHT_SYMTAB = 2
SHT_NOBITS = 8
EIFMT_SVAL = 4
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_MAX_STACK_SIZE = 0x23
_STATIC_SECTIONS = (".nv.global", ".nv.managed")  # .nv.global and .nv.global.init (and managed data).


@dataclasses.dataclass(frozen=True)
class KernelInfo:
  name: str
  param_sizes: tuple[int, ...]  # Bytes of each parameter, by ordinal (EIATTR_KPARAM_INFO).
  param_bytes: int  # Size of the parameter buffer (EIATTR_CBANK_PARAM_SIZE; 0 without parameters).
  local_bytes: int  # Local memory per thread: max(frame size, stack size).


@dataclasses.dataclass(frozen=True)
class CubinInfo:
  kernels: tuple[str, ...]  # Entry functions (STO_CUDA_ENTRY).
  undefined: tuple[str, ...]  # External functions the code calls (vprintf, malloc, free, ...).
  global_bytes: int  # Static __device__ memory (.nv.global, .nv.global.init, managed), 64-bit.
  shared_bytes: dict  # Kernel -> static shared memory section size.
  kernel_info: dict  # Kernel -> KernelInfo.


def _entries(data: bytes):
  """(attribute, value) pairs of an .nv.info section: value is an int (16-bit forms) or bytes (sized form)."""
  i = 0
  while i + 4 <= len(data):
    fmt, attr, half = data[i], data[i + 1], struct.unpack_from("<H", data, i + 2)[0]
    if fmt == EIFMT_SVAL:
      if i + 4 + half > len(data):
        raise ValueError("truncated .nv.info entry")
      yield attr, data[i + 4:i + 4 + half]
      i += 4 + half
    else:
      yield attr, half
      i += 4


def read_cubin(cubin: bytes) -> CubinInfo:
  """Reads the symbol table, the static memory and the kernels' .nv.info of a 64-bit little-endian ELF cubin.

  Raises:
    ValueError: not an ELF64 cubin, or a malformed one.
  """
  try:
    return _read(cubin)
  except (struct.error, IndexError) as e:
    raise ValueError(f"malformed cubin: {e}") from e


def _read(cubin: bytes) -> CubinInfo:
  if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
    raise ValueError("not a 64-bit little-endian ELF cubin")
  shoff, = struct.unpack_from("<Q", cubin, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
  # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
  secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

  def cstr(off):
    end = cubin.index(b"\0", off)
    return cubin[off:end].decode(errors="replace")

  def body(s):
    return b"" if s[1] == SHT_NOBITS else cubin[s[4]:s[4] + s[5]]

  names = [cstr(secs[shstrndx][4] + s[0]) for s in secs]
  symbols = []  # (name, info, other, section index, value, size)
  for s in secs:
    if s[1] == SHT_SYMTAB:
      strtab = secs[s[6]][4]
      for j in range(s[5] // 24):
        st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", cubin, s[4] + j * 24)
        symbols.append((cstr(strtab + st_name), st_info, st_other, st_shndx, st_value, st_size))
      break
  kernels = [n for n, info, other, shndx, _, _ in symbols if info & 0xF == 2 and other & 0x10 and shndx]
  undefined = sorted({n for n, info, _, shndx, _, _ in symbols if shndx == 0 and n and info >> 4 == 1})
  extent = {}
  for k, (n, s) in enumerate(zip(names, secs)):
    if n.startswith(_STATIC_SECTIONS):
      extent[k] = s[5]
  for _, _, _, shndx, value, size in symbols:
    if shndx in extent:
      extent[shndx] = max(extent[shndx], value + size)
  shared = {n[len(".nv.shared."):]: s[5] for n, s in zip(names, secs)
            if n.startswith(".nv.shared.") and not n.startswith(".nv.shared.reserved")}
  local: dict[str, int] = {}
  for n, s in zip(names, secs):
    if n == ".nv.info":
      for attr, value in _entries(body(s)):
        if attr in (EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE, EIATTR_MAX_STACK_SIZE) and len(value) >= 8:
          sym, nbytes = struct.unpack_from("<II", value)
          if sym < len(symbols):
            local[symbols[sym][0]] = max(local.get(symbols[sym][0], 0), nbytes)
  params: dict[str, dict[int, int]] = {}
  param_bytes: dict[str, int] = {}
  for n, s in zip(names, secs):
    if not n.startswith(".nv.info."):
      continue
    kname = n[len(".nv.info."):]
    sizes = params.setdefault(kname, {})
    for attr, value in _entries(body(s)):
      if attr == EIATTR_KPARAM_INFO and len(value) >= 12:
        _, ordinal, _, flags = struct.unpack_from("<IHHI", value)
        sizes[ordinal] = (flags >> 18) & 0x3FFF
      elif attr == EIATTR_CBANK_PARAM_SIZE and isinstance(value, int):
        param_bytes[kname] = value
  info = {}
  for k in kernels:
    sizes = params.get(k, {})
    if sorted(sizes) != list(range(len(sizes))):
      raise ValueError(f"kernel {k}: parameter ordinals {sorted(sizes)} are not 0..n-1")
    info[k] = KernelInfo(name=k, param_sizes=tuple(sizes[o] for o in range(len(sizes))),
                         param_bytes=param_bytes.get(k, 0), local_bytes=local.get(k, 0))
  return CubinInfo(kernels=tuple(kernels), undefined=tuple(undefined), global_bytes=sum(extent.values()),
                   shared_bytes=shared, kernel_info=info)


def abi_param_bytes(sizes) -> int:
  """Size of a parameter buffer laid out with natural alignment (each parameter aligned to its own size)."""
  off = 0
  for s in sizes:
    off = -(-off // s) * s + s
  return off
