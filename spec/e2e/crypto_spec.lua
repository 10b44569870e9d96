-- Spec: mp.crypto in the real binary (its C half is src/core/crypto.c,
-- reached through the FFI, so the vectors run where the code runs, under
-- the sanitizers too). Published vectors (FIPS 180, RFC 4231, RFC 4648,
-- RFC 6070, RFC 7914, the GCM spec), then random inputs checked against
-- Node's crypto, then the misuse errors and their line.
local H = require "spec.helper"
local cjson = require "cjson"

local run = require("spec.batteries").run

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end

describe("mp.crypto", function()
  after_each(H.cleanup)

  it("hashes as FIPS 180 and RFC 1321 say", function()
    local r = run([[
      local c = mp.crypto
      local million = string.rep("a", 1000000)
      local h = c.hash("sha256")
      for i = 1, 1000 do h:update(million:sub((i - 1) * 1000 + 1, i * 1000)) end
      return {
        md5 = c.md5("", "hex"), md5abc = c.md5("abc", "hex"),
        sha1 = c.sha1("abc", "hex"), sha256 = c.sha256("abc", "hex"),
        sha224 = c.sha224("abc", "hex"), sha384 = c.sha384("abc", "hex"),
        sha512 = c.sha512("abc", "hex"),
        two = c.sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "hex"),
        raw = #c.sha256("abc"), digest = c.digest("sha1", "abc", "hex"),
        million = h:final("hex"), again = h:reset():update("abc"):final("hex"),
      }]])
    assert.equal("d41d8cd98f00b204e9800998ecf8427e", r.md5)
    assert.equal("900150983cd24fb0d6963f7d28e17f72", r.md5abc)
    assert.equal("a9993e364706816aba3e25717850c26c9cd0d89d", r.sha1)
    assert.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", r.sha256)
    assert.equal("23097d223405d8228642a477bda255b32aadbce4bda0b3f7e36c9da7", r.sha224)
    assert.equal("cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed" ..
      "8086072ba1e7cc2358baeca134c825a7", r.sha384)
    assert.equal("ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a" ..
      "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f", r.sha512)
    assert.equal("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", r.two)
    assert.equal(32, r.raw)
    assert.equal("a9993e364706816aba3e25717850c26c9cd0d89d", r.digest)
    assert.equal("cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", r.million)
    assert.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", r.again)
  end)

  it("computes HMAC as RFC 4231 and RFC 2202 say", function()
    local r = run([[
      local c = mp.crypto
      local k1, k6 = string.rep("\11", 20), string.rep("\170", 131)
      local m2 = "what do ya want for nothing?"
      return {
        c.hmac("sha256", k1, "Hi There", "hex"),
        c.hmac("sha512", k1, "Hi There", "hex"),
        c.hmac("sha256", "Jefe", m2, "hex"),
        c.hmac("sha256", k6, "Test Using Larger Than Block-Size Key - Hash Key First", "hex"),
        c.hmac("sha1", "Jefe", m2, "hex"),
        c.hex.encode(c.hmac("sha384", "Jefe", m2)),
      }]])
    assert.same({
      "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
      "87aa7cdea5ef619d4ff0b4241a1d6cb02379f4e2ce4ec2787ad0b30545e17cde" ..
        "daa833b7d6b8a702038b274eaea3f4e4be9d914eeb61f1702e696c203a126854",
      "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
      "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
      "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79",
      "af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e" ..
        "8e2240ca5e69e2c78b3239ecfab21649",
    }, r)
  end)

  it("encodes and decodes base64 (RFC 4648) and hex, refusing bad input", function()
    local r = run([[
      local c = mp.crypto
      local out = {}
      for _, s in ipairs({ "", "f", "fo", "foo", "foob", "fooba", "foobar" }) do
        out[#out + 1] = { c.base64.encode(s), c.base64.encode_url(s),
                          c.base64.decode(c.base64.encode(s)) == s,
                          c.base64.decode_url(c.base64.encode_url(s)) == s }
      end
      local bad = {}
      for _, s in ipairs({ "Zg=", "Z===", "Zm9v\n", "Z", "Zg==Zg==", "-_-_" }) do
        local v, err = c.base64.decode(s)
        bad[#bad + 1] = tostring(v) .. " " .. tostring(err)
      end
      return { out = out, bad = bad, url = c.base64.encode_url("\251\255\191\254"),
               std = c.base64.encode("\251\255\191\254"), nopad = c.base64.decode("Zm8"),
               hex = c.hex.encode("\0\159\255"), unhex = c.hex.decode("009FfF") == "\0\159\255",
               badhex = { c.hex.decode("abc") } }]])
    local want = { { "", "" }, { "Zg==", "Zg" }, { "Zm8=", "Zm8" }, { "Zm9v", "Zm9v" },
                   { "Zm9vYg==", "Zm9vYg" }, { "Zm9vYmE=", "Zm9vYmE" }, { "Zm9vYmFy", "Zm9vYmFy" } }
    for i, w in ipairs(want) do
      assert.same({ w[1], w[2], true, true }, r.out[i])
    end
    for _, b in ipairs(r.bad) do assert.equal("nil invalid base64", b) end
    assert.equal("-_-__g", r.url)
    assert.equal("+/+//g==", r.std)
    assert.equal("fo", r.nopad)
    assert.equal("009fff", r.hex)
    assert.is_true(r.unhex)
    assert.same({ nil, "invalid hex" }, { r.badhex[1] ~= cjson.null and r.badhex[1] or nil, r.badhex[2] })
  end)

  it("derives keys as RFC 6070 (PBKDF2) and RFC 7914 (scrypt) say", function()
    local r = run([[
      local c, h = mp.crypto, mp.crypto.hex.encode
      return {
        h(c.pbkdf2("password", "salt", 1, 20, "sha1")),
        h(c.pbkdf2("password", "salt", 4096, 20, "sha1")),
        h(c.pbkdf2("pass\0word", "sa\0lt", 4096, 16, "sha1")),
        h(c.scrypt("", "", { N = 16, r = 1, p = 1, len = 64 })),
        h(c.scrypt("password", "NaCl", { N = 1024, r = 8, p = 16, len = 64 })),
        #c.scrypt("pw", "salt"),
      }]])
    assert.same({
      "0c60c80f961f0e71f3a9b524af6012062fe037a6",
      "4b007901b765489abead49d926f721d065a429c1",
      "56fa6aa75548099dcc37d7f03425e0c3",
      "77d6576238657b203b19ca42c18a0497f16b4844e3074ae8dfdffa3fede21442" ..
        "fcd0069ded0948f8326a753a0fc81f17e8d3e0fb2e0d3628cf35e20c38d18906",
      "fdbabe1c9d3472007856e7190d01e9fe7c6ad7cbc8237830e77376634b373162" ..
        "2eaf30d92e22a3886ff109279d9830dac727afb94a83ee6d8360cbdfa2cc0640",
      32,
    }, r)
  end)

  it("seals and opens with AES-256-GCM, refusing a changed byte, aad or key", function()
    local r = run([[
      local c = mp.crypto
      local k, k2 = c.random(32), c.random(32)
      local s = c.seal(k, "attack at dawn", "hdr")
      local s2 = c.seal(k, "attack at dawn", "hdr")
      local flipped = {}
      for i = 1, #s do
        local t = s:sub(1, i - 1) .. string.char(bit.bxor(s:byte(i), 1)) .. s:sub(i + 1)
        local v, err = c.open(k, t, "hdr")
        if v or err ~= "bad tag" then flipped[#flipped + 1] = i end
      end
      local big = string.rep("x", 3 * 1048576)
      return { len = #s, same_iv = s:sub(1, 12) == s2:sub(1, 12),
               back = c.open(k, s, "hdr"), noaad = { c.open(k, s) },
               otheraad = { c.open(k, s, "hdx") }, otherkey = { c.open(k2, s, "hdr") },
               short = { c.open(k, "short") }, flipped = flipped,
               empty = c.open(k, c.seal(k, "")), big = c.open(k, c.seal(k, big)) == big }]])
    assert.equal(12 + 14 + 16, r.len)
    assert.is_false(r.same_iv)
    assert.equal("attack at dawn", r.back)
    for _, k in ipairs({ "noaad", "otheraad", "otherkey", "short" }) do
      assert.equal("bad tag", r[k][2], k)
    end
    assert.same({}, r.flipped)
    assert.equal("", r.empty)
    assert.is_true(r.big)
  end)

  it("makes random bytes, uuids v4 and v7, and compares in constant time", function()
    local r = run([[
      local c = mp.crypto
      local seen, dup = {}, false
      for _ = 1, 1000 do
        local s = c.random(16)
        if seen[s] then dup = true end
        seen[s] = true
      end
      local v7 = {}
      for i = 1, 50 do v7[i] = c.uuid(7) end
      return { dup = dup, n0 = #c.random(0), n = #c.random(100000), v4 = c.uuid(), v7 = v7,
               now = os.time(), eq = { c.equal("abc", "abc"), c.equal("abc", "abd"),
               c.equal("abc", "ab"), c.equal("", "") } }]])
    assert.is_false(r.dup)
    assert.equal(0, r.n0)
    assert.equal(100000, r.n)
    assert.truthy(r.v4:match("^%x%x%x%x%x%x%x%x%-%x%x%x%x%-4%x%x%x%-[89ab]%x%x%x%-%x+$"))
    assert.equal(36, #r.v4)
    local ms = tonumber(r.v7[1]:sub(1, 8) .. r.v7[1]:sub(10, 13), 16)
    assert.is_true(math.abs(ms / 1000 - r.now) < 5, "v7 carries the time")
    for i, u in ipairs(r.v7) do
      assert.truthy(u:match("^%x+%-%x+%-7%x%x%x%-[89ab]"), u)
      if i > 1 then assert.is_true(u:sub(1, 13) >= r.v7[i - 1]:sub(1, 13)) end
    end
    assert.same({ true, false, false, true }, r.eq)
  end)

  it("agrees with Node's crypto on random inputs", function()
    if not H.exists("/usr/bin/node") then pending("no node") return end
    math.randomseed(os.time())
    local cases = {}
    for i = 1, 40 do
      local n = (i <= 10) and (i - 1) or math.random(0, 3000)
      local b = {}
      for j = 1, n do b[j] = string.char(math.random(0, 255)) end
      cases[i] = { data = table.concat(b), key = string.rep(string.char(i), i * 5) }
    end
    local input = {}
    for i, c in ipairs(cases) do input[i] = { hex(c.data), hex(c.key) } end
    local js = [[
      const c = require("crypto");
      const cases = JSON.parse(require("fs").readFileSync(0, "utf8"));
      console.log(JSON.stringify(cases.map(([d, k]) => {
        const b = Buffer.from(d, "hex"), key = Buffer.from(k, "hex");
        return [c.createHash("sha256").update(b).digest("hex"),
                c.createHash("sha1").update(b).digest("hex"),
                c.createHash("md5").update(b).digest("hex"),
                c.createHmac("sha512", key).update(b).digest("hex"),
                c.createHmac("sha1", key).update(b).digest("hex"),
                b.toString("base64"), b.toString("base64url")];
      })));
    ]]
    local stdin = H.tmpdir() .. "/cases.json"
    H.write_file(stdin, cjson.encode(input))
    local st, out = H.exec({ "/usr/bin/node", "-e", js }, { stdin = stdin })
    assert.equal(0, st)
    local want = cjson.decode(out)
    local got = run("local c = mp.crypto local out = {}\n" ..
      "for i, t in ipairs(cjson.decode(" .. ("%q"):format(cjson.encode(input)) .. ")) do\n" ..
      "  local d, k = c.hex.decode(t[1]), c.hex.decode(t[2])\n" ..
      "  out[i] = { c.sha256(d, 'hex'), c.sha1(d, 'hex'), c.md5(d, 'hex'),\n" ..
      "    c.hmac('sha512', k, d, 'hex'), c.hmac('sha1', k, d, 'hex'),\n" ..
      "    c.base64.encode(d), c.base64.encode_url(d) }\n" ..
      "  assert(c.base64.decode(out[i][6]) == d and c.base64.decode_url(out[i][7]) == d)\n" ..
      "end return out")
    assert.same(want, got)
  end)

  it("raises on misuse at the caller's line", function()
    local r = run([[
      local c, out = mp.crypto, {}
      local function try(f, ...) local ok, err = pcall(f, ...) out[#out + 1] = err end
      try(function() local _ = c.hmac("sha3", "k", "m") end)
      try(function() local _ = c.sha256({}) end)
      try(function() local _ = c.sha256("x", "base32") end)
      try(function() local _ = c.seal("short", "x") end)
      try(function() local _ = c.random(-1) end)
      try(function() local _ = c.hash("whirlpool") end)
      try(function() local _ = c.pbkdf2("p", "s", 0, 16) end)
      try(function() local _ = c.scrypt("p", "s", { N = 15 }) end)
      try(function() local _ = c.scrypt("p", "s", { N = 2^24, r = 8 }) end)
      try(function() local _ = c.uuid(5) end)
      try(function() local h = c.hash("sha1") h:final() h:update("x") end)
      return out]])
    local want = {
      "unknown algorithm 'sha3'", "string expected, got table", 'nil or "hex" expected',
      "a 32-byte key expected", "0 to 1048576 bytes", "unknown algorithm 'whirlpool'",
      "1 to 100000000 iterations", "power of two", "power of two", "nil, 4 or 7",
      "update after final",
    }
    for i, w in ipairs(want) do
      assert.truthy(H.plain(r[i], w), r[i])
      assert.truthy(r[i]:match("^[^:]*t%.lua:%d+:"), "names the script's line: " .. r[i])
    end
  end)
end)
