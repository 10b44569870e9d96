-- SPDX-License-Identifier: MIT
-- mp.crypto: hashes, HMAC, random bytes, constant-time comparison,
-- AES-256-GCM, PBKDF2/scrypt, base64/hex and uuids over src/core/crypto.c
-- (libcrypto underneath), called through LuaJIT's FFI: the calls compile
-- into the caller's trace, with none of the C API's per-call stack work.
-- Set as mp.crypto by lx_crypto_open (src/lx/lx_crypto.c); the binary
-- exports the crypto_* symbols, so ffi.C finds them.
--
-- Misuse (a bad argument, an unknown algorithm) raises at the caller's
-- line; input that fails to decode or authenticate returns nil, err.
local ffi = require("ffi")

ffi.cdef([[
int crypto_alg(const char *name, size_t len);
int crypto_hash(int alg, const void *p, size_t n, uint8_t *out);
typedef struct crypto_hash crypto_hash_t;
crypto_hash_t *crypto_hash_new(int alg);
int crypto_hash_update(crypto_hash_t *h, const void *p, size_t n);
int crypto_hash_final(crypto_hash_t *h, uint8_t *out);
int crypto_hash_reset(crypto_hash_t *h);
void crypto_hash_free(crypto_hash_t *h);
int crypto_hmac(int alg, const void *key, size_t klen, const void *msg,
                size_t mlen, uint8_t *out);
int crypto_pbkdf2(int alg, const void *pass, size_t plen, const void *salt,
                  size_t slen, uint32_t iterations, uint8_t *out, size_t outlen);
int crypto_scrypt(const void *pass, size_t plen, const void *salt, size_t slen,
                  uint64_t N, uint32_t r, uint32_t p, uint8_t *out, size_t outlen);
int crypto_random(void *out, size_t n);
int crypto_equal(const void *a, const void *b, size_t n);
int crypto_gcm_seal(const uint8_t *key, const uint8_t *iv, const void *aad,
                    size_t aadlen, const void *pt, size_t n, uint8_t *out);
int crypto_gcm_open(const uint8_t *key, const uint8_t *iv, const void *aad,
                    size_t aadlen, const uint8_t *ct, size_t n, uint8_t *out);
size_t crypto_base64_len(size_t n, int flags);
size_t crypto_base64_encode(char *out, const void *in, size_t n, int flags);
long crypto_base64_decode(uint8_t *out, const char *in, size_t n, int flags);
size_t crypto_hex_encode(char *out, const void *in, size_t n);
long crypto_hex_decode(uint8_t *out, const char *in, size_t n);
int crypto_uuid(int version, char *out);
]])

local C = ffi.C
local fstr, cast, type, error, tostring = ffi.string, ffi.cast, type, error, tostring
local floor, format = math.floor, string.format
local setmetatable = setmetatable

local B64_URL, B64_NOPAD = 1, 2
local ALG = {}  -- "sha256" -> the C enum, for the names crypto_alg knows
for _, name in ipairs({ "md5", "sha1", "sha224", "sha256", "sha384", "sha512" }) do
  ALG[name] = C.crypto_alg(name, #name)
end

-- Output space, grown by doubling and kept for the lane: one allocation
-- for the life of the lane in the usual case. Outputs over 1 MiB get a
-- buffer of their own instead, so one big call doesn't pin its size.
local digest = ffi.new("uint8_t[64]")
local buf, cap = ffi.new("uint8_t[?]", 4096), 4096
local function space(n)
  if n <= cap then return buf end
  if n > 1048576 then return ffi.new("uint8_t[?]", n) end
  while cap < n do cap = cap * 2 end
  buf = ffi.new("uint8_t[?]", cap)
  return buf
end

local function checkstr(v, argn, fname)
  if type(v) == "string" then return v end
  if type(v) == "number" then return tostring(v) end
  error(format("bad argument #%d to '%s' (string expected, got %s)", argn, fname, type(v)), 3)
end

local function alg_of(name, argn, fname)
  local a = ALG[name]
  if a then return a end
  error(format("bad argument #%d to '%s' (unknown algorithm '%s')", argn, fname, tostring(name)), 3)
end

local function hexed(p, n)
  local out = space(2 * n)
  C.crypto_hex_encode(cast("char *", out), p, n)
  return fstr(out, 2 * n)
end

-- enc: nil (raw bytes) or "hex"
local function result(p, n, enc, argn, fname)
  if enc == nil then return fstr(p, n) end
  if enc == "hex" then return hexed(p, n) end
  error(format("bad argument #%d to '%s' (nil or \"hex\" expected)", argn, fname), 3)
end

local M = {}

local function hasher(name)
  local a = ALG[name]
  return function(s, enc)
    s = checkstr(s, 1, name)
    local n = C.crypto_hash(a, s, #s, digest)
    if n < 0 then return nil, "crypto: " .. name .. " failed" end
    local v = result(digest, n, enc, 2, name) -- no tail call: the error level counts this frame
    return v
  end
end
M.md5 = hasher("md5")
M.sha1 = hasher("sha1")
M.sha224 = hasher("sha224")
M.sha256 = hasher("sha256")
M.sha384 = hasher("sha384")
M.sha512 = hasher("sha512")

-- mp.crypto.digest(alg, s [, "hex"])
function M.digest(alg, s, enc)
  local a = alg_of(alg, 1, "digest")
  s = checkstr(s, 2, "digest")
  local n = C.crypto_hash(a, s, #s, digest)
  if n < 0 then return nil, "crypto: " .. alg .. " failed" end
  local v = result(digest, n, enc, 3, "digest") -- no tail call: the error level counts this frame
  return v
end

function M.hmac(alg, key, s, enc)
  local a = alg_of(alg, 1, "hmac")
  key = checkstr(key, 2, "hmac")
  s = checkstr(s, 3, "hmac")
  local n = C.crypto_hmac(a, key, #key, s, #s, digest)
  if n < 0 then return nil, "crypto: hmac failed" end
  local v = result(digest, n, enc, 4, "hmac") -- no tail call: the error level counts this frame
  return v
end

-- Streaming hashes: mp.crypto.hash("sha256") -> h; h:update(s) -> h;
-- h:final([ "hex" ]) -> digest; h:reset() -> h.
local hash_mt = {}
hash_mt.__index = hash_mt
function M.hash(alg)
  local a = alg_of(alg, 1, "hash")
  local h = C.crypto_hash_new(a)
  if h == nil then return nil, "crypto: " .. alg .. " failed" end
  return setmetatable({ h = ffi.gc(h, C.crypto_hash_free) }, hash_mt)
end
function hash_mt:update(s)
  s = checkstr(s, 1, "update")
  if C.crypto_hash_update(self.h, s, #s) ~= 0 then
    error("hash:update after final (call reset first)", 2)
  end
  return self
end
function hash_mt:final(enc)
  local n = C.crypto_hash_final(self.h, digest)
  if n < 0 then error("hash:final called twice (call reset first)", 2) end
  local v = result(digest, n, enc, 1, "final") -- no tail call: the error level counts this frame
  return v
end
function hash_mt:reset()
  if C.crypto_hash_reset(self.h) ~= 0 then error("hash:reset failed", 2) end
  return self
end

function M.random(n)
  if type(n) ~= "number" or n < 0 or n ~= floor(n) or n > 1048576 then
    error("bad argument #1 to 'random' (0 to 1048576 bytes expected)", 2)
  end
  local out = space(n)
  local rc = C.crypto_random(out, n)
  if rc ~= 0 then return nil, "crypto: getrandom failed (" .. rc .. ")" end
  return fstr(out, n)
end

function M.equal(a, b)
  a = checkstr(a, 1, "equal")
  b = checkstr(b, 2, "equal")
  -- The lengths may show; the bytes don't.
  if #a ~= #b then return false end
  return C.crypto_equal(a, b, #a) == 1
end

-- ---- encodings ----

local function b64enc(flags, fname)
  return function(s)
    s = checkstr(s, 1, fname)
    local n = tonumber(C.crypto_base64_len(#s, flags))
    local out = space(n)
    C.crypto_base64_encode(cast("char *", out), s, #s, flags)
    return fstr(out, n)
  end
end
local function b64dec(flags, fname)
  return function(s)
    s = checkstr(s, 1, fname)
    local out = space(floor(#s / 4) * 3 + 3)
    local n = C.crypto_base64_decode(out, s, #s, flags)
    if n < 0 then return nil, "invalid base64" end
    return fstr(out, n)
  end
end
M.base64 = {
  encode = b64enc(0, "encode"),
  decode = b64dec(0, "decode"),
  encode_url = b64enc(B64_URL + B64_NOPAD, "encode_url"),
  decode_url = b64dec(B64_URL, "decode_url"),
}

M.hex = {
  encode = function(s)
    s = checkstr(s, 1, "encode")
    return hexed(s, #s)
  end,
  decode = function(s)
    s = checkstr(s, 1, "decode")
    local out = space(floor(#s / 2) + 1)
    local n = C.crypto_hex_decode(out, s, #s)
    if n < 0 then return nil, "invalid hex" end
    return fstr(out, n)
  end,
}

-- ---- AES-256-GCM ----

-- seal(key, plaintext [, aad]) -> iv .. ciphertext .. tag, with a fresh
-- random 96-bit iv each time (the chance of a repeat stays under 2^-32
-- for the first 2^32 seals under one key: rotate keys before that).
local iv = ffi.new("uint8_t[12]")
function M.seal(key, s, aad)
  key = checkstr(key, 1, "seal")
  if #key ~= 32 then error("bad argument #1 to 'seal' (a 32-byte key expected)", 2) end
  s = checkstr(s, 2, "seal")
  aad = aad == nil and "" or checkstr(aad, 3, "seal")
  if C.crypto_random(iv, 12) ~= 0 then return nil, "crypto: getrandom failed" end
  local n = #s
  local out = space(n + 28)
  ffi.copy(out, iv, 12)
  if C.crypto_gcm_seal(key, iv, aad, #aad, s, n, out + 12) ~= 0 then
    return nil, "crypto: seal failed"
  end
  return fstr(out, n + 28)
end

-- open(key, sealed [, aad]) -> plaintext, or nil, "bad tag" when it was
-- not sealed under this key and aad or was changed since.
function M.open(key, s, aad)
  key = checkstr(key, 1, "open")
  if #key ~= 32 then error("bad argument #1 to 'open' (a 32-byte key expected)", 2) end
  s = checkstr(s, 2, "open")
  aad = aad == nil and "" or checkstr(aad, 3, "open")
  local n = #s - 28
  if n < 0 then return nil, "bad tag" end
  local p = cast("const uint8_t *", s)
  local out = space(n + 1)
  local rc = C.crypto_gcm_open(key, p, aad, #aad, p + 12, n, out)
  if rc ~= 0 then
    if rc == -74 then return nil, "bad tag" end -- EBADMSG
    return nil, "crypto: open failed"
  end
  return fstr(out, n)
end

-- ---- password hashing ----

-- pbkdf2(password, salt, iterations, length [, alg = "sha256"])
function M.pbkdf2(pass, salt, iter, len, alg)
  pass = checkstr(pass, 1, "pbkdf2")
  salt = checkstr(salt, 2, "pbkdf2")
  if type(iter) ~= "number" or iter < 1 or iter > 1e8 or iter ~= floor(iter) then
    error("bad argument #3 to 'pbkdf2' (1 to 100000000 iterations expected)", 2)
  end
  if type(len) ~= "number" or len < 1 or len > 1048576 or len ~= floor(len) then
    error("bad argument #4 to 'pbkdf2' (a length of 1 to 1048576 expected)", 2)
  end
  local a = alg_of(alg or "sha256", 5, "pbkdf2")
  local out = space(len)
  if C.crypto_pbkdf2(a, pass, #pass, salt, #salt, iter, out, len) ~= 0 then
    return nil, "crypto: pbkdf2 failed"
  end
  return fstr(out, len)
end

-- scrypt(password, salt [, { N = 16384, r = 8, p = 1, len = 32 }])
function M.scrypt(pass, salt, o)
  pass = checkstr(pass, 1, "scrypt")
  salt = checkstr(salt, 2, "scrypt")
  if o ~= nil and type(o) ~= "table" then
    error("bad argument #3 to 'scrypt' (table or nil expected)", 2)
  end
  o = o or {}
  local N, r, p, len = o.N or 16384, o.r or 8, o.p or 1, o.len or 32
  for k, v in pairs({ N = N, r = r, p = p, len = len }) do
    if type(v) ~= "number" or v < 1 or v ~= floor(v) then
      error("bad argument #3 to 'scrypt' (" .. k .. " must be a positive integer)", 2)
    end
  end
  if len > 1048576 then error("bad argument #3 to 'scrypt' (len over 1048576)", 2) end
  local out = space(len)
  local rc = C.crypto_scrypt(pass, #pass, salt, #salt, N, r, p, out, len)
  if rc == -22 then
    error("bad argument #3 to 'scrypt' (N must be a power of two >= 2 and 128*N*r at most 1 GiB)", 2)
  end
  if rc ~= 0 then return nil, "crypto: scrypt failed" end
  return fstr(out, len)
end

-- ---- uuids ----

-- uuid() or uuid(4): random (RFC 9562 v4); uuid(7): the Unix time in ms
-- first, then random bits, so they sort by creation time.
local utext = ffi.new("char[36]")
function M.uuid(v)
  if v ~= nil and v ~= 4 and v ~= 7 then
    error("bad argument #1 to 'uuid' (nil, 4 or 7 expected)", 2)
  end
  if C.crypto_uuid(v or 4, utext) ~= 0 then return nil, "crypto: getrandom failed" end
  return fstr(utext, 36)
end

return M
