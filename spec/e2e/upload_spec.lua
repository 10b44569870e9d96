-- Spec: streamed multipart uploads (req:parts, part:save / read / body)
-- and req.form from small multipart bodies, through the real binary with
-- curl -F (a big file among them: 1 GiB on release, 64 MiB under the
-- sanitizers) and Node's fetch with FormData; limits and bad bodies get
-- 413 and 400.
local H = require "spec.helper"
local cjson = require "cjson"

local start, cleanup = H.fixture_servers("upload_app.lua")

local function curl(args)
  local p = assert(io.popen("/usr/bin/curl -s -i --max-time " .. H.T(120) .. " " .. args .. " 2>&1"))
  local out = p:read("*a")
  p:close()
  local final = out:gsub("^HTTP/1%.1 100 Continue\r\n\r\n", "")
  local status = tonumber(final:match("^HTTP/1%.1 (%d+)"))
  local body = final:match("\r\n\r\n(.*)$")
  return status, body, out
end

local function sh(cmd)
  local ok = os.execute(cmd)
  return ok == true or ok == 0
end

describe("multipart uploads (end to end)", function()
  after_each(cleanup)
  local srv, port, bport, dir, url, burl
  before_each(function()
    dir = H.tmpdir()
    bport = H.free_port()
    srv, port = start({ bport, dir })
    H.wait_for(function() return srv:listens_on(bport) end, H.T(5), "the buffered port")
    url = "http://127.0.0.1:" .. port
    burl = "http://127.0.0.1:" .. bport
  end)

  it("curl -F: fields, a file saved to disk, a part read in pieces, a part left unread", function()
    H.write_file(dir .. "/in.txt", "line 1\r\n--line 2\r\n")
    local st, body = curl("-F a=1 -F 'f=@" .. dir .. "/in.txt;type=text/x-test' -F pieces=abcdefgh " ..
      "-F 'skip=@" .. dir .. "/in.txt' -F last=end " .. url .. "/upload")
    assert.equal(200, st, body)
    local v = cjson.decode(body)
    assert.same({ name = "a", value = "1" }, v[1])
    assert.equal("f", v[2].name)
    assert.equal("in.txt", v[2].filename)
    assert.equal("text/x-test", v[2].type)
    assert.equal(18, v[2].saved)
    assert.equal("line 1\r\n--line 2\r\n", H.read_file(v[2].path))
    assert.same({ 3, 3, 2 }, v[3].sizes)
    assert.is_true(v[4].skipped)
    assert.same({ name = "last", value = "end" }, v[5])
  end)

  it("a big file generated on the fly goes to disk whole", function()
    local size = H.sanitized and 64 * 2 ^ 20 or 2 ^ 30
    local src = dir .. "/big.bin"
    -- a keystream, so the bytes are neither zeros nor a short period
    assert.is_true(sh(("%s enc -aes-128-ctr -pass pass:moonport -nosalt -pbkdf2 < /dev/zero 2>/dev/null " ..
      "| head -c %d > %s"):format(H.openssl, size, src)))
    local st, body = curl("-F note=big -F 'big=@" .. src .. "' " .. url .. "/upload")
    assert.equal(200, st, body)
    local v = cjson.decode(body)
    assert.same({ name = "note", value = "big" }, v[1])
    assert.equal(size, v[2].saved)
    assert.is_true(sh("cmp -s " .. src .. " " .. v[2].path), "the saved file differs")
    os.remove(v[2].path)
    os.remove(src)
  end)

  it("Node's fetch with FormData: a text field, a binary file, an odd file name", function()
    local size = 3 * 2 ^ 20 + 17
    local st, out, err = H.exec({ "/usr/bin/node", H.root .. "/spec/node/upload_fetch.js", url .. "/upload", size },
      { timeout = H.T(60) })
    assert.equal(0, st, err)
    local v = cjson.decode(out)
    assert.equal(200, v.status)
    local parts = v.body
    assert.same({ name = "title", value = 'héllo wörld "quoted"' }, parts[1])
    assert.equal("data.bin", parts[2].filename)
    assert.equal("application/x-test", parts[2].type)
    assert.equal(size, parts[2].saved)
    local data = H.read_file(parts[2].path)
    assert.equal(size, #data)
    for _, i in ipairs({ 0, 1, 250, 251, 65535, 65536, size - 1 }) do
      assert.equal((i * 7 + 3) % 251, data:byte(i + 1), "byte " .. i)
    end
    -- undici escapes '"' in a file name as %22
    assert.equal("we%22ird name.txt", parts[3].filename)
    assert.equal("x\r\n--not-a-boundary\r\n", H.read_file(parts[3].path))
  end)

  -- bytes that are neither zeros nor a short period, and CRs and "--"
  -- among them
  local function bytes(n, seed)
    local t, x = {}, seed
    for i = 1, n do
      x = (x * 1103515245 + 12345) % 2147483648
      t[i] = string.char(x % 256)
    end
    return table.concat(t)
  end

  it("part:save from a handler that lags (the body piles up and reading pauses): every file whole", function()
    local sizes = { 1048576 + 7, 300000, 5, 65536 }
    local args = {}
    for i, n in ipairs(sizes) do
      H.write_file(dir .. "/in" .. i, bytes(n, i))
      args[#args + 1] = "-F 'f" .. i .. "=@" .. dir .. "/in" .. i .. "'"
    end
    local st, body = curl(table.concat(args, " ") .. " " .. url .. "/slow")
    assert.equal(200, st, body)
    local v = cjson.decode(body)
    assert.equal(#sizes, #v)
    for i, n in ipairs(sizes) do
      assert.equal("f" .. i, v[i].name)
      assert.equal(n, v[i].saved, v[i].err)
      assert.is_true(sh("cmp -s " .. dir .. "/in" .. i .. " " .. v[i].path), "file " .. i .. " differs")
    end
  end)

  it("a request pipelined right behind an upload sent once the handler waits: both answered, the file whole", function()
    local data = bytes(200 * 1024 + 3, 99)
    local body = "--zz\r\nContent-Disposition: form-data; name=\"f\"; filename=\"p.bin\"\r\n\r\n" ..
      data .. "\r\n--zz--\r\n"
    local c = H.connect(port)
    assert.is_true(H.send(c, "POST /upload HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n" ..
      "Content-Type: multipart/form-data; boundary=zz\r\nContent-Length: " .. #body .. "\r\n\r\n"))
    -- the 100 goes out when the handler first asks for the body: it waits now
    assert(H.read_until(c, "100 Continue\r\n\r\n", H.T(10)))
    assert.is_true(H.send(c, body .. "GET /after HTTP/1.1\r\nHost: t\r\n\r\n"))
    local out = assert(H.read_until(c, function(b) return b:find("\r\n\r\nafter$") end, H.T(10)))
    c:close()
    local first, second = out:match("^(HTTP/1%.1 200 .-)(HTTP/1%.1 200 .*)$")
    assert.truthy(first, out)
    local v = cjson.decode(first:match("\r\n\r\n(.*)$"))
    assert.equal(#data, v[1].saved)
    assert.equal(data, H.read_file(v[1].path))
    assert.truthy(second:find("\r\n\r\nafter$"))
  end)

  it("keeps the connection alive after a whole upload", function()
    local p = assert(io.popen("/usr/bin/curl -s -o /dev/null -w '%{http_code} %{num_connects}\\n' " ..
      "-F a=1 " .. url .. "/upload --next -s -o /dev/null -w '%{http_code} %{num_connects}\\n' -F b=2 " ..
      url .. "/upload"))
    local out = p:read("*a")
    p:close()
    assert.equal("200 1\n200 0\n", out)
  end)

  it("limits: too many parts, a part header too large, a part too large: 413", function()
    local st, body = curl("-F a=1 -F b=2 -F c=3 " .. url .. "/limited")
    assert.equal(413, st)
    assert.equal("multipart: too many parts\n", body)
    st, body = curl("-F 'a=1;headers=X-Long: " .. ("x"):rep(200) .. "' " .. url .. "/limited")
    assert.equal(413, st)
    assert.equal("multipart: part header too large\n", body)
    H.write_file(dir .. "/k.bin", ("k"):rep(1001))
    st, body = curl("-F 'f=@" .. dir .. "/k.bin' " .. url .. "/limited")
    assert.equal(413, st)
    assert.equal("multipart: part too large\n", body)
    H.write_file(dir .. "/k.bin", ("k"):rep(1000))
    st, body = curl("-F 'f=@" .. dir .. "/k.bin' " .. url .. "/limited")
    assert.equal(200, st, body)
    assert.equal(1000, cjson.decode(body)[1].saved)
  end)

  it("bad bodies: 400 (truncated, a bad delimiter line, not multipart); the handler may catch it", function()
    local mpct = "-H 'Content-Type: multipart/form-data; boundary=zz' "
    local function file(data)
      H.write_file(dir .. "/body", data)
      return "--data-binary @" .. dir .. "/body "
    end
    local st, body = curl(mpct .. file("--zz\r\n\r\nabc") .. url .. "/upload")
    assert.equal(400, st)
    assert.equal("multipart: the body ended inside the multipart data\n", body)
    st, body = curl(mpct .. file("--zzX\r\n\r\nabc\r\n--zz--") .. url .. "/upload")
    assert.equal(400, st)
    assert.equal("multipart: bad delimiter line\n", body)
    st, body = curl("--data-binary 'a=1' " .. url .. "/upload")
    assert.equal(400, st)
    assert.equal("multipart: the request is not multipart/form-data\n", body)
    st, body = curl("-H 'Content-Type: multipart/form-data; boundary=\"a;b\"' --data-binary x " .. url .. "/upload")
    assert.equal(400, st)
    assert.equal("multipart: bad boundary\n", body)
    st, body = curl(mpct .. file("--zz\r\n\r\nabc") .. url .. "/caught")
    assert.equal(422, st)
    assert.same({ ok = false, status = 400, message = "multipart: the body ended inside the multipart data" },
      cjson.decode(body))
    -- the lane keeps serving
    assert.equal(200, (curl("-F a=1 " .. url .. "/upload")))
  end)

  it("a buffered body: req.form gets the fields (not the files), req:parts() walks it", function()
    H.write_file(dir .. "/in.txt", "file data")
    local st, body = curl("-F a=1 -F 'b=two words' -F 'f=@" .. dir .. "/in.txt' -F a=3 '" .. burl .. "/?q=x'")
    assert.equal(200, st, body)
    assert.same({ q = "x", a = "3", b = "two words" }, cjson.decode(body))
    st, body = curl("-F a=1 -F 'f=@" .. dir .. "/in.txt' " .. burl .. "/parts")
    assert.equal(200, st, body)
    local v = cjson.decode(body)
    assert.same({ name = "a", value = "1" }, v[1])
    assert.equal(9, v[2].saved)
    -- a bad multipart body leaves req.form with the query's fields
    st, body = curl("-H 'Content-Type: multipart/form-data; boundary=zz' --data-binary 'junk' '" ..
      burl .. "/?q=y'")
    assert.equal(200, st)
    assert.same({ q = "y" }, cjson.decode(body))
  end)
end)
