-- Spec: cookies with SameSite and a CORS preflight from another origin in
-- a real browser: headless Chromium (spec/node/webapp_browser.js) against
-- spec/fixtures/browser_app.lua.
local H = require "spec.helper"
local JS = require "spec.js"

local start, cleanup = H.fixture_servers("browser_app.lua")

describe("cookies and CORS in Chromium", function()
  after_each(cleanup)

  it("SameSite decides what goes cross-site; a preflighted credentialed POST works only from the allowed origin", function()
    local why = JS.missing()
    assert(not why, why)
    assert(H.exists("/usr/bin/chromium"), "no /usr/bin/chromium (scripts/setup installs it)")
    local page_port = H.free_port()
    local srv, port = start({ page_port }, { workers = 1 })
    H.wait_for(function() return srv:listens_on(page_port) end, H.T(5), "the page port")
    local rows = JS.run("webapp_browser.js", { port, page_port }, 60, srv)
    local function step(name) return assert(JS.find(rows, "step", name), name .. " missing") end
    -- HttpOnly keeps lax out of document.cookie
    local doc = step("set").doc_cookie
    assert.truthy(doc:find("strict=1", 1, true), doc)
    assert.truthy(doc:find("plain=1", 1, true), doc)
    assert.falsy(doc:find("lax=", 1, true), doc)
    assert.same({ lax = "1", strict = "1", plain = "1" }, step("same-origin").cookies)
    -- a cross-site fetch carries none of them (Lax, Strict, and Lax by default)
    assert.same({}, step("cross-fetch").cookies)
    local post = step("cors-post")
    assert.equal(200, post.status)
    assert.same({ x = 1 }, post.body.got)
    assert.equal("tok", post.body.token)
    assert.truthy(post.id and post.id:find("^%x+%-%x+$"), tostring(post.id))
    assert.truthy(step("cors-denied").error:find("Failed to fetch", 1, true))
    -- a cross-site top-level navigation carries Lax cookies, not Strict ones
    assert.same({ lax = "1", plain = "1" }, step("cross-nav").cookies)
    local st, out = H.exec({ "/usr/bin/curl", "-s", "http://127.0.0.1:" .. port .. "/preflights" })
    assert.equal(0, st)
    -- two preflights: the allowed one and the refused one
    assert.equal('{"n":2}', out)
  end)
end)
