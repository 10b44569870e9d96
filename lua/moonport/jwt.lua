-- SPDX-License-Identifier: MIT
-- mp.jwt: JSON Web Tokens (RFC 7519) signed with HS256/384/512 (HMAC),
-- RS256 (RSA PKCS#1 v1.5), ES256 (ECDSA P-256) or EdDSA (Ed25519), over
-- mp.crypto and src/core/crypto_pkey.c (through the FFI).
--
-- verify never trusts the token to choose how it is checked: the caller
-- lists the algorithms it accepts, "none" is never among them, and a key
-- is used only for its own kind of algorithm (a PEM or JWK public key is
-- never an HMAC secret, which is the classic algorithm-confusion attack:
-- an RS256 public key offered as the HS256 secret). Any token it refuses
-- is nil, err; only misuse raises.
local ffi = require("ffi")
local crypto = require("moonport.crypto")
local cjson = require("cjson.safe")

ffi.cdef([[
typedef struct crypto_pkey crypto_pkey_t;
crypto_pkey_t *crypto_pkey_from_pem(const char *pem, size_t len);
crypto_pkey_t *crypto_pkey_from_jwk(int type, const uint8_t *a, size_t alen,
                                    const uint8_t *b, size_t blen);
int crypto_pkey_type(const crypto_pkey_t *k);
int crypto_pkey_private(const crypto_pkey_t *k);
void crypto_pkey_free(crypto_pkey_t *k);
int crypto_pkey_sign(crypto_pkey_t *k, const void *msg, size_t mlen,
                     uint8_t *out, size_t *outlen);
int crypto_pkey_verify(crypto_pkey_t *k, const void *msg, size_t mlen,
                       const uint8_t *sig, size_t slen);
]])
local C = ffi.C

local type, error, tostring, pairs, ipairs, setmetatable = type, error, tostring, pairs, ipairs,
  setmetatable
local find, sub = string.find, string.sub
local b64e, b64d = crypto.base64.encode_url, crypto.base64.decode_url
local hmac, equal = crypto.hmac, crypto.equal
local encode, decode = cjson.encode, cjson.decode

local PKEY_RSA, PKEY_EC, PKEY_ED = 1, 2, 3

-- Each algorithm: the HMAC digest, or the key type it needs.
local ALGS = {
  HS256 = { hmac = "sha256" }, HS384 = { hmac = "sha384" }, HS512 = { hmac = "sha512" },
  RS256 = { pkey = PKEY_RSA }, ES256 = { pkey = PKEY_EC }, EdDSA = { pkey = PKEY_ED },
}

local M = {}

-- ---- keys ----

-- A parsed key: { pkey = cdata, type =, private = } for RSA/EC/Ed25519,
-- or { secret = s } for HMAC; kid and alg from a JWK.
local key_mt = {}
key_mt.__index = key_mt

local function wrap_pkey(p, kid, alg)
  p = ffi.gc(p, C.crypto_pkey_free)
  return setmetatable({ pkey = p, type = C.crypto_pkey_type(p),
    private = C.crypto_pkey_private(p) == 1, kid = kid, alg = alg }, key_mt)
end

local function pem_key(pem)
  local p = C.crypto_pkey_from_pem(pem, #pem)
  if p == nil then
    return nil, "not a usable key (PEM of an RSA 2048-8192, EC P-256 or Ed25519 key)"
  end
  return wrap_pkey(p)
end

local function jwk_key(jwk)
  if type(jwk) ~= "table" then return nil, "a JWK must be a table" end
  local kty, kid, alg = jwk.kty, jwk.kid, jwk.alg
  if jwk.use ~= nil and jwk.use ~= "sig" then return nil, "not a signing key" end
  if kty == "oct" then
    local k = type(jwk.k) == "string" and b64d(jwk.k)
    if not k or k == "" then return nil, "bad oct JWK" end
    return setmetatable({ secret = k, kid = kid, alg = alg }, key_mt)
  end
  local t, a, b
  if kty == "RSA" then
    t, a, b = PKEY_RSA, jwk.n, jwk.e
  elseif kty == "EC" and jwk.crv == "P-256" then
    t, a, b = PKEY_EC, jwk.x, jwk.y
  elseif kty == "OKP" and jwk.crv == "Ed25519" then
    t, a, b = PKEY_ED, jwk.x, ""
  else
    return nil, "unsupported JWK (kty " .. tostring(kty) .. ")"
  end
  a = type(a) == "string" and b64d(a)
  b = type(b) == "string" and b64d(b)
  if not a or not b then return nil, "bad " .. kty .. " JWK" end
  local p = C.crypto_pkey_from_jwk(t, a, #a, b, #b)
  if p == nil then return nil, "bad " .. kty .. " JWK" end
  return wrap_pkey(p, kid, alg)
end

-- mp.jwt.key(pem | jwk) -> a key for sign/verify, or nil, err. Parsing
-- is the expensive part of an RSA or EC key: keep the result.
function M.key(v)
  if type(v) == "string" then
    if find(v, "-----BEGIN", 1, true) then return pem_key(v) end
    return setmetatable({ secret = v }, key_mt)
  end
  if type(v) == "table" then
    if getmetatable(v) == key_mt then return v end
    return jwk_key(v)
  end
  error("bad argument #1 to 'key' (a PEM string, a secret or a JWK table expected)", 2)
end

-- The keys of a verify call's `keys` argument as a list, cached per lane
-- by the string or table given (at most 64 of each; PEM parsing and JWKS
-- decoding happen once).
local by_string, nstrings = {}, 0
local by_table = setmetatable({}, { __mode = "k" })

local function key_list(keys, level)
  local tk = type(keys)
  if tk == "string" then
    local l = by_string[keys]
    if l then return l end
    if keys == "" then error("mp.jwt: an empty secret", level + 1) end
    if sub(keys, 1, 1) == "{" then
      local set = decode(keys)
      if type(set) ~= "table" then error("mp.jwt: keys is not valid JWKS JSON", level + 1) end
      l = key_list(set, level + 1)
    elseif find(keys, "-----BEGIN", 1, true) then
      local k, err = pem_key(keys)
      if not k then error("mp.jwt: " .. err, level + 1) end
      l = { k }
    else
      l = { setmetatable({ secret = keys }, key_mt) }
    end
    if nstrings >= 64 then by_string, nstrings = {}, 0 end
    by_string[keys] = l
    nstrings = nstrings + 1
    return l
  end
  if tk ~= "table" then
    error("mp.jwt: keys must be a secret, a PEM, a key, a list of them or a JWKS", level + 1)
  end
  if getmetatable(keys) == key_mt then return { keys } end
  local l = by_table[keys]
  if l then return l end
  l = {}
  if keys.keys ~= nil or keys.kty ~= nil then
    for _, jwk in ipairs(keys.keys or { keys }) do
      -- A JWKS may carry keys of kinds we don't use: skip them, but a
      -- set left empty is an error
      local k = jwk_key(jwk)
      if k then l[#l + 1] = k end
    end
  else
    for i, v in ipairs(keys) do
      local sub_l = key_list(v, level + 1)
      for _, k in ipairs(sub_l) do l[#l + 1] = k end
      if i > 1024 then error("mp.jwt: more than 1024 keys", level + 1) end
    end
  end
  if #l == 0 then error("mp.jwt: no usable key in keys", level + 1) end
  by_table[keys] = l
  return l
end

-- ---- signing ----

local sigbuf = ffi.new("uint8_t[1024]")
local siglen = ffi.new("size_t[1]")

-- mp.jwt.sign(claims, key, { alg = "HS256", kid =, header = {} }) -> token
function M.sign(claims, key, opts)
  if type(claims) ~= "table" then error("bad argument #1 to 'sign' (claims table expected)", 2) end
  opts = opts or {}
  local alg = opts.alg or "HS256"
  local spec = ALGS[alg]
  if not spec then error("bad argument #3 to 'sign' (alg must be HS256, HS384, HS512, RS256, ES256 or EdDSA)", 2) end
  local k = key
  if type(k) == "string" and find(k, "-----BEGIN", 1, true) then
    -- a PEM's parse costs more than the signature: cached as verify's keys
    local ok, l = pcall(key_list, k, 1)
    if not ok then error("bad argument #2 to 'sign' (" .. l:gsub("^mp%.jwt: ", "") .. ")", 2) end
    k = l[1]
  elseif getmetatable(k) ~= key_mt then
    local err
    k, err = M.key(key)
    if not k then error("bad argument #2 to 'sign' (" .. err .. ")", 2) end
  end
  local header = { alg = alg, typ = "JWT", kid = opts.kid or k.kid }
  for hk, hv in pairs(opts.header or {}) do header[hk] = hv end
  local head, body = encode(header), encode(claims)
  if not head or not body then error("bad argument #1 to 'sign' (claims must encode as JSON)", 2) end
  local input = b64e(head) .. "." .. b64e(body)
  if spec.hmac then
    if not k.secret then error("bad argument #2 to 'sign' (" .. alg .. " needs a secret string)", 2) end
    return input .. "." .. b64e(hmac(spec.hmac, k.secret, input))
  end
  if k.type ~= spec.pkey or not k.private then
    error("bad argument #2 to 'sign' (" .. alg .. " needs its kind of private key)", 2)
  end
  siglen[0] = 1024
  if C.crypto_pkey_sign(k.pkey, input, #input, sigbuf, siglen) ~= 0 then
    return nil, "jwt: signing failed"
  end
  return input .. "." .. b64e(ffi.string(sigbuf, siglen[0]))
end

-- ---- verifying ----

-- Decoded headers by their base64url text: the tokens of one issuer
-- share a handful (at most 256 kept).
local headers, nheaders = {}, 0

local function header_of(seg)
  local h = headers[seg]
  if h then return h end
  local json = b64d(seg)
  h = json and decode(json)
  if type(h) ~= "table" or type(h.alg) ~= "string" then return nil end
  if nheaders >= 256 then headers, nheaders = {}, 0 end
  headers[seg] = h
  nheaders = nheaders + 1
  return h
end

-- opts table -> the set of its algs, checked once per opts table.
local algsets = setmetatable({}, { __mode = "k" })

local function check_opts(opts, level)
  if type(opts) ~= "table" or type(opts.algs) ~= "table" or #opts.algs == 0 then
    error("mp.jwt.verify: opts.algs must list the algorithms to accept, e.g. { algs = { \"HS256\" } }",
      level + 1)
  end
  local set = algsets[opts]
  if set then return set end
  set = {}
  for _, a in ipairs(opts.algs) do
    if not ALGS[a] then
      error("mp.jwt.verify: unknown algorithm '" .. tostring(a) ..
        "' in algs (HS256, HS384, HS512, RS256, ES256, EdDSA)", level + 1)
    end
    set[a] = true
  end
  if opts.leeway ~= nil and (type(opts.leeway) ~= "number" or opts.leeway < 0) then
    error("mp.jwt.verify: leeway must be seconds >= 0", level + 1)
  end
  algsets[opts] = set
  return set
end

local function one_of(v, want)
  if type(want) == "string" then return v == want end
  for _, w in ipairs(want) do if v == w then return true end end
  return false
end

local function check_claims(c, opts)
  local now = opts.now or os.time()
  local leeway = opts.leeway or 0
  local exp, nbf, iat = c.exp, c.nbf, c.iat
  if exp ~= nil then
    if type(exp) ~= "number" then return "bad exp claim" end
    if now >= exp + leeway then return "expired" end
  end
  if nbf ~= nil then
    if type(nbf) ~= "number" then return "bad nbf claim" end
    if now + leeway < nbf then return "not yet valid" end
  end
  if iat ~= nil then
    if type(iat) ~= "number" then return "bad iat claim" end
    if now + leeway < iat then return "issued in the future" end
  end
  if opts.max_age then
    if type(iat) ~= "number" then return "no iat claim" end
    if now - leeway > iat + opts.max_age then return "too old" end
  end
  if opts.require_exp and exp == nil then return "no exp claim" end
  if opts.iss ~= nil and not one_of(c.iss, opts.iss) then return "wrong issuer" end
  if opts.sub ~= nil and c.sub ~= opts.sub then return "wrong subject" end
  if opts.aud ~= nil then
    local aud = c.aud
    if type(aud) == "string" then
      if not one_of(aud, opts.aud) then return "wrong audience" end
    elseif type(aud) == "table" then
      local hit = false
      for _, a in ipairs(aud) do if one_of(a, opts.aud) then hit = true break end end
      if not hit then return "wrong audience" end
    else
      return "wrong audience"
    end
  end
  return nil
end

-- mp.jwt.verify(token, keys, { algs = {...}, aud =, iss =, sub =,
--   leeway =, max_age =, require_exp =, now = }) -> claims, header; or
--   nil, err.
function M.verify(token, keys, opts)
  local algset = check_opts(opts, 2)
  local list = key_list(keys, 2)
  if type(token) ~= "string" then return nil, "malformed token" end
  if #token > 65536 then return nil, "token too large" end
  local d1 = find(token, ".", 1, true)
  local d2 = d1 and find(token, ".", d1 + 1, true)
  if not d2 or find(token, ".", d2 + 1, true) then return nil, "malformed token" end
  local header = header_of(sub(token, 1, d1 - 1))
  if not header then return nil, "malformed token" end
  local alg = header.alg
  if alg == "none" or alg == "NONE" or alg == "None" then return nil, "alg none refused" end
  if not algset[alg] then return nil, "algorithm not allowed: " .. alg end
  if header.crit ~= nil then return nil, "unsupported crit header" end
  local spec = ALGS[alg]
  local input, sigseg = sub(token, 1, d2 - 1), sub(token, d2 + 1)
  local kid = header.kid
  local tried, ok = 0, false
  local sig
  for i = 1, #list do
    local k = list[i]
    if (kid == nil or k.kid == nil or k.kid == kid) and (k.alg == nil or k.alg == alg) then
      if spec.hmac then
        if k.secret then
          tried = tried + 1
          -- compared as text: only the canonical encoding is accepted
          if equal(b64e(hmac(spec.hmac, k.secret, input)), sigseg) then ok = true break end
        end
      elseif k.type == spec.pkey then
        tried = tried + 1
        sig = sig or b64d(sigseg)
        if not sig then return nil, "malformed token" end
        local v = C.crypto_pkey_verify(k.pkey, input, #input, sig, #sig)
        if v == 1 then ok = true break end
      end
    end
  end
  if tried == 0 then
    return nil, kid and ("no " .. alg .. " key with kid " .. tostring(kid)) or ("no key for " .. alg)
  end
  if not ok then return nil, "bad signature" end
  local json = b64d(sub(token, d1 + 1, d2 - 1))
  local claims = json and decode(json)
  if type(claims) ~= "table" then return nil, "malformed claims" end
  local err = check_claims(claims, opts)
  if err then return nil, err end
  -- a copy: the cached header is shared by every token that carries it
  local h = {}
  for hk, hv in pairs(header) do h[hk] = hv end
  return claims, h
end

-- mp.jwt.decode(token) -> claims, header WITHOUT checking anything: for
-- reading a kid or an iss before choosing keys.
function M.decode(token)
  if type(token) ~= "string" then return nil, "malformed token" end
  local d1 = find(token, ".", 1, true)
  local d2 = d1 and find(token, ".", d1 + 1, true)
  if not d2 then return nil, "malformed token" end
  local hj, cj = b64d(sub(token, 1, d1 - 1)), b64d(sub(token, d1 + 1, d2 - 1))
  local h, c = hj and decode(hj), cj and decode(cj)
  if type(h) ~= "table" or type(c) ~= "table" then return nil, "malformed token" end
  return c, h
end

return M
