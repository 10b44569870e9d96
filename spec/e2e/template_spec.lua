-- Spec: mp.template in the real binary: escaping, raw output, code
-- blocks, includes, layouts with blocks (two levels), whitespace control,
-- errors naming the template file and line, the per-lane cache, and
-- res:render over HTTP (curl) setting text/html.
local H = require "spec.helper"
local run = require("spec.batteries").run

describe("mp.template", function()
  after_each(H.cleanup)

  it("escapes <>&\"' by default and prints raw only when asked", function()
    local r = run([=[
      local T = mp.template
      local f = T.compile([[{{ s }}|{{{ s }}}|{{ raw(s) }}|{{ n }}|{{ missing }}|{{ b }}|{{ s:upper() }}]])
      return { f({ s = [[<a href="x">'&']], n = 42.5, b = false }), T.escape("<&>"),
               T.compile("plain")(), T.compile("{{ x }}")() }]=])
    assert.same({
      [[&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;|<a href="x">'&'|<a href="x">'&'|42.5||false|]] ..
        [[&lt;A HREF=&quot;X&quot;&gt;&#39;&amp;&#39;]],
      "&lt;&amp;&gt;", "plain", "" }, r)
  end)

  it("runs code blocks, includes and layouts with blocks", function()
    local files = {
      ["views/base.html"] = "<title>{% block title %}Site{% endblock %}</title>\n" ..
        "<main>{% block body %}empty{% endblock %}</main>\n{% block foot %}(c){% endblock %}",
      ["views/two.html"] = '{% extends "views/base.html" %}{% block title %}Two{% endblock %}' ..
        "{% block foot %}two-foot{% endblock %}",
      ["views/page.html"] = '{% extends "views/two.html" %}\nignored text\n' ..
        "{% block body %}<ul>{% for i, r in ipairs(rows) do %}" ..
        '{% include "views/row.html", { r = r, i = i } %}{% end %}</ul>{% endblock %}',
      ["views/row.html"] = "<li>{{ i }}={{ r }}</li>",
      ["views/self.html"] = "({{ n }}{% if n > 0 then %}{% include \"views/self.html\", { n = n - 1 } %}{% end %})",
      ["views/base_only.html"] = '{% include "views/row.html" %}',
    }
    local r = run([=[
      local T = mp.template
      T.root = arg[0]:match("^(.*)/")
      return {
        page = T.render("views/page.html", { rows = { "<a>", "b" } }),
        base = T.render("views/base.html"),
        self = T.render("views/self.html", { n = 3 }),
        ctx = T.render("views/base_only.html", { i = 7, r = "x" }),
        trim = T.compile("<p>\n  {%- for i = 1, 3 do -%}\n  {{ i }}\n  {%- end -%}\n</p>")(),
        comment = T.compile("a{# not {{ shown }} #}b")(),
        nolocal = T.compile("{% x = 5 %}{{ x }}")() .. tostring(rawget(_G, "x")),
      }]=], { files = files })
    assert.equal("<title>Two</title>\n<main><ul><li>1=&lt;a&gt;</li><li>2=b</li></ul></main>\ntwo-foot", r.page)
    assert.equal("<title>Site</title>\n<main>empty</main>\n(c)", r.base)
    assert.equal("(3(2(1(0))))", r.self)
    assert.equal("<li>7=x</li>", r.ctx)
    assert.equal("<p>123</p>", r.trim)
    assert.equal("ab", r.comment)
    assert.equal("5nil", r.nolocal)
  end)

  it("names the template file and line in errors", function()
    local files = {
      ["views/bad.html"] = "line 1\nline 2\n<p>{{ user.name.first }}</p>\n",
      ["views/syntax.html"] = "ok\n\n{% for i = 1, %}\n{% end %}",
      ["views/inc.html"] = "a\nb\n{% include \"views/nope.html\" %}",
      ["views/open.html"] = "a\n{{ x",
      ["views/table.html"] = "\n\n\n{{ t }}",
    }
    local r = run([=[
      local T, out = mp.template, {}
      T.root = arg[0]:match("^(.*)/")
      for _, f in ipairs({ "bad", "syntax", "inc", "open", "table" }) do
        local ok, err = pcall(T.render, "views/" .. f .. ".html", { t = {} })
        out[#out + 1] = ok and "no error" or err
      end
      local ok, err = pcall(T.compile, "x\n{{ 1 + }}", "inline.html")
      out[#out + 1] = err
      ok, err = pcall(T.render, "../etc/passwd")
      out[#out + 1] = err
      ok, err = pcall(T.compile("{{ x }}"), "not a table")
      out[#out + 1] = err
      return out]=], { files = files })
    assert.truthy(r[1]:match("^views/bad%.html:3: "), r[1])
    assert.truthy(r[2]:match("^views/syntax%.html:3: "), r[2])
    assert.truthy(r[3]:match("^views/inc%.html:3: template: .*nope%.html: No such file"), r[3])
    assert.truthy(r[4]:match("^views/open%.html:2: unclosed {{"), r[4])
    assert.truthy(r[5]:match("^views/table%.html:4: template: cannot print a table"), r[5])
    assert.truthy(r[6]:match("^inline%.html:2: "), r[6])
    assert.truthy(H.plain(r[7], "without .."), r[7])
    assert.truthy(H.plain(r[8], "the context must be a table"), r[8])
  end)

  it("compiles a file once per lane, sees edits after a reload, serves res:render as text/html", function()
    local dir = H.tmpdir()
    assert(require("lfs").mkdir(dir .. "/views"))
    local page = dir .. "/views/page.html"
    H.write_file(page, "<h1>{{ title }}</h1>{% for _, f in ipairs(items) do %}<p>{{ f }}</p>{% end %}")
    local function app(port)
      H.write_file(dir .. "/app.lua", [[
        local mp = require "moonport"
        mp.http { port = ]] .. port .. [[, on_request = function(req, res)
          if req.path == "/bad" then res:render("views/missing.html", {}) return end
          res:render("views/page.html", { title = req.query or "t", items = { "<x>", "y" } }, 201)
        end }]])
      return dir .. "/app.lua"
    end
    local function get(port, path)
      local st, out = H.exec({ "/usr/bin/curl", "-s", "-i", "http://127.0.0.1:" .. port .. path })
      assert.equal(0, st)
      return out
    end
    -- one lane: the first render reads and compiles; an edit is not seen
    local port = H.free_port()
    local srv = H.start(app(port), { wait_port = port, threads = 1 })
    local out = get(port, "/?a<b")
    assert.truthy(out:match("^HTTP/1%.1 201"), out)
    assert.truthy(out:lower():find("content-type: text/html; charset=utf-8", 1, true), out)
    assert.truthy(H.plain(out, "<h1>a&lt;b</h1><p>&lt;x&gt;</p><p>y</p>"), out)
    H.write_file(page, "edited {{ title }}")
    assert.truthy(H.plain(get(port, "/?again"), "<h1>again</h1>"))
    local bad = get(port, "/bad")
    assert.truthy(bad:match("^HTTP/1%.1 500"), bad)
    H.wait_for(function() return H.plain(srv:stderr(), "missing.html") end, H.T(5),
      function() return "the error logged: " .. srv:stderr() end)
    assert.truthy(srv:stderr():match("app%.lua:%d+: template: .*missing%.html"), srv:stderr())
    srv:kill(H.SIGTERM)
    srv:wait_exit(H.T(10))

    -- workers: a reload starts new lanes, which read the edited file
    H.write_file(page, "<h1>{{ title }}</h1>")
    port = H.free_port()
    srv = H.start(app(port), { wait_port = port, options = { "-w", "2" } })
    assert.truthy(H.plain(get(port, "/?v1"), "<h1>v1</h1>"))
    H.write_file(page, "<h2>{{ title }}</h2>")
    srv:kill(H.SIGHUP)
    H.wait_for(function()
      local seen = 0
      for _ = 1, 6 do if H.plain(get(port, "/?v2"), "<h2>v2</h2>") then seen = seen + 1 end end
      return seen == 6
    end, H.T(20), function() return "the edit served after the reload: " .. srv:describe() end)
  end)

  it("--watch reloads when a template beside the script or in views/ is saved", function()
    local dir = H.tmpdir()
    local port = H.free_port()
    assert(require("lfs").mkdir(dir .. "/views"))
    H.write_file(dir .. "/page.html", "<p>one {{ n }}</p>")
    H.write_file(dir .. "/views/foot.html", "<i>f1</i>")
    H.write_file(dir .. "/app.lua", [[
      local mp = require "moonport"
      mp.http { port = ]] .. port .. [[, on_request = function(req, res)
        res:render(req.path == "/foot" and "views/foot.html" or "page.html", { n = mp.worker() })
      end }]])
    -- -v: a routine reload's "--watch: reloaded" line is at info
    local srv = H.start(dir .. "/app.lua", { wait_port = port, options = { "-v", "-w", "2", "--watch" } })
    local function body()
      local _, out = H.exec({ "/usr/bin/curl", "-s", "http://127.0.0.1:" .. port .. "/" })
      return out
    end
    assert.truthy(body():match("^<p>one %d</p>$"))
    local tmp = dir .. "/page.html.tmp"
    H.write_file(tmp, "<p>two {{ n }}</p>")
    assert(os.rename(tmp, dir .. "/page.html"))
    -- the reload first: a lane that had not compiled page.html yet serves the
    -- new text without one, so "two" alone would not show that --watch saw it
    local function reloads() return H.count_lines(srv:stderr(), "--watch: reloaded") end
    H.wait_for(function() return reloads() >= 1 end, H.T(20),
      function() return "--watch saw the saved page.html: " .. srv:describe() end)
    H.wait_for(function()
      for _ = 1, 6 do if not body():match("^<p>two %d</p>$") then return false end end
      return true
    end, H.T(20), function() return "the saved template served: " .. srv:describe() end)
    local function foot()
      local _, out = H.exec({ "/usr/bin/curl", "-s", "http://127.0.0.1:" .. port .. "/foot" })
      return out
    end
    assert.equal("<i>f1</i>", foot())
    H.write_file(dir .. "/views/foot.html", "<i>f2</i>")
    H.wait_for(function() return reloads() >= 2 end, H.T(20),
      function() return "--watch saw the saved views/foot.html: " .. srv:describe() end)
    H.wait_for(function()
      for _ = 1, 6 do if foot() ~= "<i>f2</i>" then return false end end
      return true
    end, H.T(20), function() return "the saved views/foot.html served: " .. srv:describe() end)
  end)
end)
