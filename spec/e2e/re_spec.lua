-- Spec: mp.re (PCRE2 with its JIT, through the FFI) in the real binary:
-- a table of PCRE2 behaviours (captures, named groups, flags, UTF-8 with
-- and without 'u', empty matches), gsub/sub/split, the match limit on a
-- catastrophic pattern, the bounded pattern cache, and misuse.
local H = require "spec.helper"
local run = require("spec.batteries").run

describe("mp.re", function()
  after_each(H.cleanup)

  it("matches as PCRE2 does: captures, named groups, flags, init", function()
    local r = run([=[
      local re, out = mp.re, {}
      local function m(...)
        local t, err = re.match(...)
        if not t then out[#out + 1] = { "nil", tostring(err) } return end
        local c = { t[0] }
        for i = 1, #t do c[#c + 1] = t[i] == false and "<false>" or t[i] end
        out[#out + 1] = c
      end
      m("hello 2024-12-01 x", [[(?<y>\d{4})-(\d\d)-(\d\d)]])
      m("abc", "(x)?(b)")
      m("HeLLo", "hello", "i")
      m("HeLLo", "hello")
      m("a\nb", "^b$")
      m("a\nb", "^b$", "m")
      m("a\nb", "a.b")
      m("a\nb", "a.b", "s")
      m("abc", "a b c", "x")
      m("xabc", "abc", "a")
      m("abcabc", "abc", nil, 2)
      m("abcabc", "abc", nil, -3)
      m("abc", "c", nil, 10)
      m("abc", "", nil, 4)
      m("user_42", [[^[a-z][a-z0-9_]{3,32}$]])
      m("cat|dog", "dog|cat", "jo")
      m("", "^$")
      m("a\0b", "a\\x00b")
      local named = re.match("2024-12", [[(?<year>\d+)-(?<month>\d+)]])
      out[#out + 1] = { named.year, named.month, named[1], named[2] }
      return out]=])
    assert.same({
      { "2024-12-01", "2024", "12", "01" },
      { "b", "<false>", "b" },
      { "HeLLo" },
      { "nil", "nil" },
      { "nil", "nil" },
      { "b" },
      { "nil", "nil" },
      { "a\nb" },
      { "abc" },
      { "nil", "nil" },
      { "abc" },
      { "abc" },
      { "nil", "nil" },
      { "" },
      { "user_42" },
      { "cat" },
      { "" },
      { "a\0b" },
      { "2024", "12", "2024", "12" },
    }, r)
  end)

  it("treats UTF-8 by characters with 'u', checks it, and by bytes without", function()
    local r = run([=[
      local re = mp.re
      local s = "caf\195\169"
      local bad = "caf\255"
      local m1, e1 = re.match(bad, "^.+$", "u")
      local m2 = re.match(bad, "^.+$")
      local m3, e3 = re.match("ok\192\128", "ok", "u")   -- an overlong form
      local words = {}
      for w in re.gmatch("ein \195\188ber \195\159", [[\S]], "u") do words[#words + 1] = w[0] end
      return { four = re.match(s, "^.{4}$", "u") ~= nil, five = re.match(s, "^.{5}$") ~= nil,
               e1 = e1, m1 = m1 == nil, m2 = m2 and #m2[0], e3 = e3, m3 = m3 == nil,
               chars = #words, find = { re.find(s, "\195\169", "u") } }]=])
    assert.is_true(r.four)
    assert.is_true(r.five)
    assert.is_true(r.m1)
    assert.truthy(r.e1:match("^invalid UTF%-8"), r.e1)
    assert.equal(4, r.m2)
    assert.is_true(r.m3)
    assert.truthy(r.e3:match("^invalid UTF%-8"), r.e3)
    assert.equal(8, r.chars)
    assert.same({ 4, 5 }, r.find)
  end)

  it("finds, iterates, replaces and splits", function()
    local r = run([=[
      local re = mp.re
      local it = {}
      for m in re.gmatch("a1b22c333", [[(\d)(\d*)]]) do it[#it + 1] = m[0] .. "/" .. m[1] end
      local empties = {}
      for m in re.gmatch("abc", "x*") do empties[#empties + 1] = "[" .. m[0] .. "]" end
      local anch = {}
      for m in re.gmatch("aab", "a", "a") do anch[#anch + 1] = m[0] end
      local calls = 0
      return {
        find = { re.find("abc123def", [[\d+]]) }, findg = { re.find("k=v", "(\\w)=(\\w)", nil, nil, 2) },
        nofind = { re.find("abc", "x") },
        it = it, empties = table.concat(empties), anch = anch,
        g1 = { re.gsub("hello world", "(o)", "<$1>") },
        g2 = { re.gsub("john smith", [[(?<f>\w+) (?<l>\w+)]], "${l}, ${f} $$ $0") },
        g3 = { re.gsub("a-b-c", "-", function(m) calls = calls + 1 return calls end) },
        g4 = { re.gsub("a b", "\\w", { a = "A" }) },
        g5 = { re.gsub("abc", "", "-") },
        g6 = { re.gsub("abc", "x", "y") },
        g7 = { re.gsub("a.b", ".", "$0$0") },
        s1 = { re.sub("aaa", "a", "b") },
        sp1 = re.split("a, b,c ,d", [[\s*,\s*]]),
        sp2 = re.split("a1b2c3", [[\d]]),
        sp3 = re.split("a,b,c,d", ",", nil, 2),
        sp4 = re.split("abc", ""),
        esc = re.match("a.b*c", re.escape("a.b*c"))[0], esc2 = re.match("axbbc", re.escape("a.b*c")),
      }]=])
    assert.same({ 4, 6 }, r.find)
    assert.same({ 3, 3 }, r.findg)
    assert.same({}, r.nofind)
    assert.same({ "1/1", "22/2", "333/3" }, r.it)
    assert.equal("[][][][]", r.empties)
    assert.same({ "a", "a" }, r.anch)
    assert.same({ "hell<o> w<o>rld", 2 }, r.g1)
    assert.same({ "smith, john $ john smith", 1 }, r.g2)
    assert.same({ "a1b2c", 2 }, r.g3)
    assert.same({ "A b", 2 }, r.g4)
    assert.same({ "-a-b-c-", 4 }, r.g5)
    assert.same({ "abc", 0 }, r.g6)
    assert.same({ "aa..bb", 3 }, r.g7)
    assert.same({ "baa", 1 }, r.s1)
    assert.same({ "a", "b", "c", "d" }, r.sp1)
    assert.same({ "a", "b", "c", "" }, r.sp2)
    assert.same({ "a", "b,c,d" }, r.sp3)
    assert.same({ "a", "b", "c" }, r.sp4)
    assert.equal("a.b*c", r.esc)
    assert.is_nil(r.esc2)
  end)

  it("stops a catastrophic pattern at the match limit, and the lane goes on", function()
    local r = run([=[
      local re = mp.re
      local t0 = os.clock()
      local m1, e1 = re.match(string.rep("a", 40) .. "b", "(a+)+$")
      local m2, e2 = re.match(string.rep("a", 40) .. "!", "^(\\w+\\s?)*$")
      local it = re.gmatch(string.rep("a", 40) .. "b", "(a|aa)+$")
      local m3, e3 = it()
      local g, e4 = re.gsub(string.rep("a", 40) .. "b", "(a+)+$", "x")
      local secs = os.clock() - t0
      return { m1 = m1 == nil, e1 = e1, m2 = m2 == nil, e2 = e2, m3 = m3 == nil, e3 = e3,
               g = g == nil, e4 = e4, secs = secs, after = re.match("still", "s(t)ill")[1],
               long = { re.find(string.rep("ab", 500000) .. "c", "c") } }]=])
    for _, k in ipairs({ "1", "2", "3", "4" }) do
      assert.equal("match limit", r["e" .. k], k)
    end
    assert.is_true(r.m1 and r.m2 and r.m3 and r.g)
    assert.equal("t", r.after)
    assert.same({ 1000001, 1000001 }, r.long)
    -- four catastrophic matches, each cut at 10^7 steps: well under the
    -- seconds a backtracking engine without a limit would take (ages)
    assert.is_true(r.secs < H.T(10), "took " .. r.secs .. " s")
  end)

  it("keeps a bounded cache of compiled patterns", function()
    local r = run([=[
      local re = mp.re
      collectgarbage()
      local before = collectgarbage("count")
      for i = 1, 20000 do assert(re.match("x" .. i, "x" .. i .. "$")) end
      collectgarbage() collectgarbage()
      local grown = collectgarbage("count") - before
      -- a constant pattern is compiled once: the same entry every time
      local t0 = os.clock()
      for _ = 1, 100000 do re.match("abc", "b") end
      return { grown = grown, limit = re.limits.cache, hot = os.clock() - t0 }]=])
    assert.equal(1024, r.limit)
    -- 20,000 distinct patterns; at most 1024 alive: a few hundred KiB of
    -- Lua heap, not 20,000 entries' worth
    assert.is_true(r.grown < 2048, "grew by " .. r.grown .. " KiB")
  end)

  it("raises on misuse at the caller's line", function()
    local r = run([=[
      local re, out = mp.re, {}
      local function try(f) local ok, err = pcall(f) out[#out + 1] = tostring(err) end
      try(function() local _ = re.match("x", "(") end)
      try(function() local _ = re.match("x", "x", "q") end)
      try(function() local _ = re.match("x", {}) end)
      try(function() local _ = re.match({}, "x") end)
      try(function() local _ = re.match("x", "x", nil, "1") end)
      try(function() local _ = re.gsub("x", "x", "$2") end)
      try(function() local _ = re.gsub("x", "(x)", "${nope}") end)
      try(function() local _ = re.gsub("x", "x", "$") end)
      try(function() local _ = re.gsub("x", "x", function() return {} end) end)
      try(function() local _ = re.gsub("x", "x", true) end)
      try(function() local _ = re.split("x", ",", nil, 0) end)
      return out]=])
    local want = { "missing closing parenthesis", "unknown flag 'q'", "pattern string expected",
                   "string expected, got table", "number expected", "names group 2",
                   "'nope'", "$ must be", "returned a table", "string, function or table",
                   "a count >= 1" }
    for i, w in ipairs(want) do
      assert.truthy(H.plain(r[i], w), r[i])
      assert.truthy(r[i]:match("t%.lua:%d+:"), "names the script's line: " .. r[i])
    end
  end)
end)
