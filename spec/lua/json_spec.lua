-- Unit specs of lua/moonport/json.lua (mp.json): no server.
local json = require("moonport.json")
local cjson = require("cjson")

describe("mp.json", function()
  it("encodes like cjson when nothing is marked", function()
    assert.equal(cjson.encode({ a = 1 }), json.encode({ a = 1 }))
    assert.equal("{}", json.encode({}))
  end)

  it("encodes a marked empty table as [] wherever it is", function()
    local e = json.array()
    assert.equal("[]", json.encode(e))
    assert.same({ list = {}, other = {} },
      cjson.decode(json.encode({ list = e, other = {} })))
    assert.truthy(json.encode({ list = e, other = {} }):find('"list":[]', 1, true))
    assert.truthy(json.encode({ list = e, other = {} }):find('"other":{}', 1, true))
    assert.equal("[[],[]]", json.encode({ e, json.array({}) }))
  end)

  it("keeps a marked table an array once it has items, and empty again", function()
    local t = json.array({})
    t[1] = "x"
    assert.equal('["x"]', json.encode(t))
    t[1] = nil
    assert.equal("[]", json.encode(t))
  end)

  it("leaves the marked tables as they were, even when encode raises", function()
    local e = json.array()
    assert.has_error(function() json.encode({ e, function() end }) end)
    assert.is_nil(next(e))
    assert.equal("[]", json.encode(e))
  end)

  it("does not touch strings that merely look like the placeholder", function()
    local e = json.array()
    local s = "\0moonport-empty-array-"
    assert.equal(cjson.encode({ s }) .. "", json.encode({ s }))
    assert.equal("[[]," .. cjson.encode(s) .. "]", json.encode({ e, s }))
  end)

  it("refuses a non-table in array()", function()
    assert.has_error(function() json.array(5) end,
      "bad argument #1 to 'array' (table expected, got number)")
  end)

  it("decodes, or gives nil and a message", function()
    assert.same({ a = { 1, 2 } }, json.decode('{"a":[1,2]}'))
    local v, err = json.decode('{"a":')
    assert.is_nil(v)
    assert.truthy(err:find("^invalid JSON: "))
    v, err = json.decode(nil)
    assert.is_nil(v)
    assert.equal("expected a string, got nil", err)
    assert.equal(json.null, json.decode("null"))
  end)
end)
