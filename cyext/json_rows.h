// JSON events straight into row-major float32 rows, with simdjson's DOM parser (the
// amalgamated simdjson that the pysimdjson package ships, compiled into this extension; see
// setup.py). No Python object is made per field: cyext/eventread.pyx calls read() once a
// message and gets the rows, the ids and, for a bad message, a reason code and its detail.
//
// What is read (README: JSON and Avro events): a message is one event (an object) or several
// (an array of objects). A "plan" maps paths of object keys to feature slots (a trie; the
// default paths are the features' names, source.fields maps dotted paths) and one path to
// the id. Numbers become float32 as an Arrow cast would (an integer is cast from its int64 or
// uint64 value, any other number from its double; one outside float32's range is
// bad_number), null or an absent field is missing
// (NaN), true/false are 1/0, strings of a feature with categories are the category's
// position (NaN: not a category, the libraries' unseen category); a CatBoost hashed feature's
// value is kept as the text CatBoost hashes (Out.cat_*). Anything else read for a
// feature is bad_type; keys the plan does not name are skipped by simdjson without being
// looked at. Every count is bounded before it is used: rows by max_rows and by max_bytes
// (the decoded size), depth by the parser's max_depth, the document by its length.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "simdjson.h"

#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

namespace swjson {

// The heap's free pages back to the system (glibc keeps freed memory below its mmap
// threshold, which grows to 32 MB); nothing elsewhere.
inline void trim_heap() {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

using simdjson::error_code;
namespace dom = simdjson::dom;

// id kinds, one a row
enum : int8_t { ID_NULL = 0, ID_INT = 1, ID_STR = 2 };

// a feature's declared cast (source.fields; formats/base.py CAST_CODES): none, a string
// holding a JSON number read as that number, an integer read as its decimal digits (a
// category's text)
enum : uint8_t { CAST_NONE = 0, CAST_NUMBER = 1, CAST_STRING = 2 };

struct Node {
    int slot = -1;     // >= 0: a feature; -2: the id; -1: an inner node (children)
    std::unordered_map<std::string, int> children;  // key -> node index
    std::string path;  // the dotted path, for error details
    std::vector<int> covers;  // an inner node: the feature slots whose paths go through it
                              // (a null here is their missing value)
    bool covers_id = false;   // an inner node on the id's path (a null here: a null id)
};

struct Plan {
    std::vector<Node> nodes;  // nodes[0]: the event (the root object)
    int n_features = 0;
    // feature slot -> its categories (string -> code); empty: not categorical
    std::vector<std::unordered_map<std::string, float>> categories;
    std::vector<uint8_t> categorical;
    // feature slot -> 1: CatBoost's hashed categories, the value's text goes to Out.cat_*
    // (append_cat; the row keeps NaN) and the caller hashes it (formats/json.py)
    std::vector<uint8_t> hashed;
    std::vector<uint8_t> optional;     // slot -> 1: an event may leave it out (Out.absent)
    std::vector<uint8_t> cast;         // slot -> CAST_*
    std::vector<std::string> labels;   // slot -> "feature 'x' (a.b)", for error details
    size_t max_rows = 0;   // 0: no bound but max_bytes
    size_t max_bytes = 0;  // the decoded size bound: rows * (4 * n_features + 8) + id bytes
    bool has_id = false;
    bool id_optional = false;  // an event may leave the id out (a null id); else missing_field
    std::string id_label;      // "the id 'x' (a.b)", for error details

    Plan() { nodes.emplace_back(); }

    // add a path (its keys in order) ending at slot; false: it clashes with another path
    bool add(const std::vector<std::string>& keys, int slot, const std::string& dotted) {
        int at = 0;
        for (size_t i = 0; i < keys.size(); i++) {
            if (nodes[at].slot != -1) return false;  // a leaf cannot have children
            if (at != 0 && slot >= 0) nodes[at].covers.push_back(slot);
            if (at != 0 && slot == -2) nodes[at].covers_id = true;
            auto it = nodes[at].children.find(keys[i]);
            int next;
            if (it == nodes[at].children.end()) {
                next = (int)nodes.size();
                nodes[at].children.emplace(keys[i], next);
                nodes.emplace_back();
                nodes[next].path = at == 0 ? keys[i] : nodes[at].path + "." + keys[i];
            } else {
                next = it->second;
            }
            at = next;
        }
        if (at == 0 || nodes[at].slot != -1 || !nodes[at].children.empty()) return false;
        nodes[at].slot = slot;
        nodes[at].path = dotted;  // as configured (a key may hold a dot)
        if (slot == -2) has_id = true;
        return true;
    }
};

struct Out {
    std::vector<float> rows;       // rows * n_features
    std::vector<int64_t> id_int;   // a row's integer id (0 where not ID_INT)
    std::vector<int8_t> id_kind;   // ID_NULL, ID_INT, ID_STR
    std::vector<int32_t> id_offsets;  // string ids: Arrow offsets (rows + 1)
    std::string id_bytes;          // string ids' bytes
    // hashed categorical values (Plan.hashed): where each is (row * n_features + slot), the
    // end of its text in cat_bytes, and the texts
    std::vector<int64_t> cat_at;
    std::vector<int32_t> cat_ends;
    std::string cat_bytes;
    std::vector<uint8_t> seen;     // this row's plan nodes met (duplicate keys)
    std::vector<uint8_t> reached;  // this row's feature slots given (a value, or a null on
                                   // the way to it)
    std::vector<int64_t> absent;   // per slot: events without an optional feature
    std::vector<int64_t> unseen;   // per slot: category strings the model does not know
    bool counted = false;          // absent or unseen holds a count
    bool id_reached = false;       // this event gave its id (a value, or a null on its way)
    size_t n_rows = 0;
    bool single = false;           // the message was one object (not an array)
    const char* code = "";         // the reason, when read() fails
    std::string detail;
    int fail_slot = -1;            // the feature the failure is about (-1: none)
    const char* fail_kind = "";    // what went wrong with it, where not `code` (cast_failed)

    void clear(size_t n_features) {
        rows.clear(); id_int.clear(); id_kind.clear(); id_offsets.assign(1, 0);
        id_bytes.clear(); n_rows = 0; single = false; code = ""; detail.clear();
        cat_at.clear(); cat_ends.clear(); cat_bytes.clear();
        fail_slot = -1; fail_kind = "";
        if (counted || absent.size() != n_features) {
            absent.assign(n_features, 0);
            unseen.assign(n_features, 0);
            counted = false;
        }
    }

    // Give a large message's buffers back (vectors keep their capacity when cleared: one
    // large message held its rows for the rest of the run), and the heap's free pages to the
    // system (glibc keeps freed memory below its mmap threshold, which grows to 32 MB).
    void release() {
        constexpr size_t LARGE = 4 << 20;
        size_t held = rows.capacity() * sizeof(float) + id_int.capacity() * 8 +
                      id_kind.capacity() + id_offsets.capacity() * 4 + id_bytes.capacity() +
                      cat_at.capacity() * 8 + cat_ends.capacity() * 4 + cat_bytes.capacity();
        if (held <= LARGE) return;
        std::vector<float>().swap(rows);
        std::vector<int64_t>().swap(id_int);
        std::vector<int8_t>().swap(id_kind);
        std::vector<int32_t>(1, 0).swap(id_offsets);
        std::string().swap(id_bytes);
        std::vector<int64_t>().swap(cat_at);
        std::vector<int32_t>().swap(cat_ends);
        std::string().swap(cat_bytes);
        trim_heap();
    }

    void count_unseen(int slot) {
        unseen[(size_t)slot]++;
        counted = true;
    }

    // the decoded size of the hashed values: their texts and 12 bytes a value
    size_t cat_size() const { return cat_bytes.size() + 12 * cat_at.size(); }
};

// A hashed categorical value's text at `at` (CatBoost hashes a value's string: a string as it
// is, an integer's decimal digits, a boolean's 1 or 0), within max_bytes with `used`, the
// decoded bytes before it (each at most max_bytes: the sum cannot wrap), and 2 GiB of text
// (int32 ends); false when it does not fit.
inline bool append_cat(Out& out, int64_t at, const char* s, size_t len, size_t used,
                       size_t max_bytes) {
    if (len > max_bytes || used > max_bytes || used + out.cat_size() + len + 12 > max_bytes ||
        out.cat_bytes.size() + len > (size_t)std::numeric_limits<int32_t>::max())
        return false;
    out.cat_bytes.append(s, len);
    out.cat_at.push_back(at);
    out.cat_ends.push_back((int32_t)out.cat_bytes.size());
    return true;
}

// an integer, or a whole double within int64 (NaN, infinities, fractions and whole doubles
// beyond int64: no text, the value has no category), as CatBoost's decimal digits; the
// text's length (0: none)
inline size_t int_text(char* buf, size_t cap, long long v) {
    return (size_t)(std::to_chars(buf, buf + cap, v).ptr - buf);
}
inline size_t uint_text(char* buf, size_t cap, unsigned long long v) {
    return (size_t)(std::to_chars(buf, buf + cap, v).ptr - buf);
}
inline size_t whole_text(char* buf, size_t cap, double d) {
    if (!std::isfinite(d) || d != std::floor(d) || !(std::fabs(d) < 9223372036854775808.0))
        return 0;
    return int_text(buf, cap, (long long)d);
}

inline int fail(Out& out, const char* code, std::string detail) {
    out.code = code;
    out.detail = std::move(detail);
    return 1;
}

// a failure about the feature in `slot` (counted by name; `kind`: what went wrong, where not
// the code)
inline int fail_at(Out& out, const char* code, int slot, std::string detail,
                   const char* kind = "") {
    out.fail_slot = slot;
    out.fail_kind = kind;
    return fail(out, code, std::move(detail));
}

// A feature's number (a JSON number or boolean, as `v` holds it) into row[slot]: an integer
// cast from its int64 or uint64 value, any other number from its double (a float32 cannot
// hold: bad_number), true/false 1/0. -1: `v` is not a number or boolean (the caller says
// why); 0: stored; 1: failed (out says why).
inline int store_number(int slot, const std::string& path, dom::element v, Out& out,
                        float* row) {
    switch (v.type()) {
    case dom::element_type::BOOL:
        row[slot] = bool(v) ? 1.0f : 0.0f;
        return 0;
    case dom::element_type::INT64:
        row[slot] = (float)int64_t(v);
        return 0;
    case dom::element_type::UINT64:
        row[slot] = (float)uint64_t(v);
        return 0;
    case dom::element_type::DOUBLE: {
        // the parser refuses a number outside the double range; one outside float32's is
        // refused here (a cast would make it infinite: JSON cannot say inf)
        double d = double(v);
        float x = (float)d;
        if (std::isinf(x) || std::isnan(x)) {
            char text[32];
            std::snprintf(text, sizeof text, "%.9g", d);
            return fail_at(out, "bad_number", slot, path + ": " + text +
                           " is outside the float32 range");
        }
        row[slot] = x;
        return 0;
    }
    default:
        return -1;
    }
}

// The longest text `cast: number` reads (a float32's digits need far fewer; a decimal of a
// long scale, "1.000...", may not).
static constexpr size_t CAST_MAX = 1024;

// `cast: number`: a string holding one JSON number (no space around it) parsed by simdjson
// as the same text outside the quotes is, so "12.30" is the float32 that 12.30 is; anything
// else is bad_type (cast_failed). `parser`: a small parser of the caller's (the message's
// own parser holds the document the string is in).
inline int cast_number(dom::parser& parser, int slot, const std::string& path,
                       std::string_view s, Out& out, float* row) {
    char buf[CAST_MAX + simdjson::SIMDJSON_PADDING];
    auto bad = [&]() {
        std::string shown(s.substr(0, 32));
        return fail_at(out, "bad_type", slot, path + ": \"" + shown +
                       (s.size() > 32 ? "...\"" : "\"") +
                       " is not a number (cast: number reads a string holding one)",
                       "cast_failed");
    };
    if (s.empty() || s.size() > CAST_MAX) return bad();
    unsigned char first = (unsigned char)s.front(), last = (unsigned char)s.back();
    if (!(first == '-' || (first >= '0' && first <= '9')) || !(last >= '0' && last <= '9'))
        return bad();  // one number, nothing around it: no space, no literal
    std::memcpy(buf, s.data(), s.size());
    std::memset(buf + s.size(), 0, simdjson::SIMDJSON_PADDING);
    dom::element v;
    if (parser.parse(buf, s.size(), false).get(v)) return bad();
    int rc = store_number(slot, path, v, out, row);
    if (rc == -1 || v.type() == dom::element_type::BOOL) return bad();
    return rc;
}

class Reader {
public:
    // the DOM parser validates the whole document (also the fields no feature reads), bounds
    // the nesting at max_depth (DEPTH_ERROR, without recursion) and copies the message into
    // its own padded buffer, grown as needed
    explicit Reader(size_t max_depth) {
        max_depth_ = max_depth;
        init_ = parser_.allocate(1 << 16, max_depth);
        if (!init_) init_ = cast_parser_.allocate(CAST_MAX + 1, 2);
    }

    // 0: rows in out; else out.code and out.detail say why
    int read(const Plan& plan, const char* data, size_t len, Out& out) {
        out.clear((size_t)plan.n_features);
        if (init_) return json_error(out, init_, "");
        if (len == 0) return fail(out, "empty", "the message has no value");
        // the parser's buffers grow with the document, up to PARSE_BYTES bytes a byte of it
        // (its padded copy, structural indexes, tape and strings): the parse is bounded like
        // the rows the message decodes into, so a message may be a sixteenth of the limit
        // (one as large as the limit took about twelve times the limit: past the budget)
        if (len > plan.max_bytes / PARSE_BYTES ||
            len > (size_t)std::numeric_limits<uint32_t>::max() - simdjson::SIMDJSON_PADDING)
            return fail(out, "too_large", "the message is " + std::to_string(len) +
                        " bytes: parsing it takes up to " + std::to_string(PARSE_BYTES) +
                        " bytes a byte, more than " + std::to_string(plan.max_bytes) +
                        " (the message byte limit)");
        if (len > parser_.capacity()) {  // grown here, so the depth bound stays
            error_code err = parser_.allocate(len, max_depth_);
            if (err) return json_error(out, err, "");
        }
        int rc = parse(plan, data, len, out);
        if (parser_.capacity() > SHRINK_ABOVE) {
            // give a large message's buffers back: all of them (allocate() shrinks the
            // structural indexes but keeps the document's tape and strings and the padded
            // copy, ten bytes a byte of the message, for the rest of the run)
            parser_ = dom::parser();
            error_code err = parser_.allocate(1 << 16, max_depth_);
            trim_heap();
            if (err && !rc) return json_error(out, err, "");
        }
        return rc;
    }

    // the parser's bytes a byte of a message, with a margin: 12.4 measured on "[1,1,...]", the
    // densest document, 9.9 on "[[],[],...]" (tests/test_json.py)
    static constexpr size_t PARSE_BYTES = 16;

private:
    static constexpr size_t SHRINK_ABOVE = 4 << 20;
    dom::parser parser_;
    dom::parser cast_parser_;  // cast: number's strings (cast_number)
    size_t max_depth_;
    error_code init_;

    int parse(const Plan& plan, const char* data, size_t len, Out& out) {
        dom::element doc;
        error_code err = parser_.parse(data, len, true).get(doc);
        if (err) return json_error(out, err, "");
        if (doc.type() == dom::element_type::OBJECT) {
            out.single = true;
            return event(plan, dom::object(doc), out);
        }
        if (doc.type() != dom::element_type::ARRAY)
            return fail(out, "bad_shape", "the message is not an object or an array of objects");
        size_t k = 0;
        for (dom::element e : dom::array(doc)) {
            if (e.type() != dom::element_type::OBJECT)
                return fail(out, "bad_shape", "element " + std::to_string(k) +
                            " of the array is not an object (an event)");
            int rc = event(plan, dom::object(e), out);
            if (rc) return rc;
            k++;
        }
        if (out.n_rows == 0) return fail(out, "empty_batch", "the array has no events");
        return 0;
    }

    static int json_error(Out& out, error_code err, const std::string& where) {
        const char* code = "bad_json";
        if (err == simdjson::DEPTH_ERROR) code = "too_deep";
        else if (err == simdjson::UTF8_ERROR) code = "bad_utf8";
        else if (err == simdjson::NUMBER_ERROR || err == simdjson::BIGINT_ERROR ||
                 err == simdjson::NUMBER_OUT_OF_RANGE) code = "bad_number";
        else if (err == simdjson::CAPACITY || err == simdjson::MEMALLOC) code = "too_large";
        std::string d = simdjson::error_message(err);
        return fail(out, code, where.empty() ? d : where + ": " + d);
    }

    // one event: a new row, NaN until read
    int event(const Plan& plan, dom::object obj, Out& out) {
        size_t f = (size_t)plan.n_features;
        size_t n = out.n_rows + 1;
        if (plan.max_rows && n > plan.max_rows)
            return fail(out, "too_large", "more than " + std::to_string(plan.max_rows) +
                        " events (delivery.max_message_rows)");
        // the decoded size: n rows of f float32 and an 8-byte id, then the ids' bytes
        if (n > plan.max_bytes / (4 * f + 8) ||
            n * (4 * f + 8) + out.id_bytes.size() + out.cat_size() > plan.max_bytes)
            return fail(out, "too_large", "more than " + std::to_string(plan.max_bytes) +
                        " bytes decoded (the message byte limit)");
        out.rows.resize(n * f, std::numeric_limits<float>::quiet_NaN());
        out.id_int.push_back(0);
        out.id_kind.push_back(ID_NULL);
        out.id_offsets.push_back((int32_t)out.id_bytes.size());
        out.seen.assign(plan.nodes.size(), 0);
        out.reached.assign(f, 0);
        out.id_reached = false;
        out.n_rows = n;
        int rc = object(plan, 0, obj, out, out.rows.data() + (n - 1) * f);
        if (rc) return rc;
        if (plan.has_id && !out.id_reached && !plan.id_optional)
            return fail(out, "missing_field", plan.id_label + " is absent " +
                        (out.single ? std::string("from the event")
                                    : "from event " + std::to_string(n - 1)) +
                        " (check its path in source.fields; a null id is sent as null)");
        // absent is not missing: a required feature no key gave (and no null on its way)
        for (size_t s = 0; s < f; s++) {
            if (out.reached[s]) continue;
            if (!plan.optional[s])
                return fail_at(out, "missing_field", (int)s, plan.labels[s] + " is absent " +
                               (out.single ? std::string("from the event")
                                           : "from event " + std::to_string(n - 1)) +
                               " (check its path in source.fields; if events may leave it "
                               "out, mark it optional)");
            out.absent[s]++;
            out.counted = true;
        }
        return 0;
    }

    // the keys of one object the plan names (a path's depth at most: no other recursion)
    int object(const Plan& plan, int at, dom::object obj, Out& out, float* row) {
        const Node& node = plan.nodes[at];
        for (dom::key_value_pair kv : obj) {
            auto it = node.children.find(std::string(kv.key));
            if (it == node.children.end()) continue;  // a field nothing reads
            const Node& child = plan.nodes[it->second];
            // a key read (a feature's, the id's, one on a feature's path) given twice
            if (out.seen[it->second])
                return fail(out, "duplicate_field", child.path + " is given twice");
            out.seen[it->second] = 1;
            int rc;
            if (child.slot != -1) {
                rc = leaf(plan, child, kv.value, out, row);
            } else if (kv.value.type() == dom::element_type::OBJECT) {
                rc = object(plan, it->second, dom::object(kv.value), out, row);
            } else if (kv.value.type() == dom::element_type::NULL_VALUE) {
                for (int s : child.covers) out.reached[(size_t)s] = 1;  // missing, all
                if (child.covers_id) out.id_reached = true;
                rc = 0;
            } else {
                rc = fail_at(out, "bad_type", child.covers.empty() ? -1 : child.covers[0],
                             child.path + " is not an object (a feature's path goes "
                             "through it)");
            }
            if (rc) return rc;
        }
        return 0;
    }

    int leaf(const Plan& plan, const Node& node, dom::element v, Out& out, float* row) {
        int slot = node.slot;
        if (slot == -2) return id(plan, node, v, out);
        out.reached[(size_t)slot] = 1;
        if (plan.hashed[slot]) return hashed(plan, node, v, out);
        if (v.type() == dom::element_type::NULL_VALUE) return 0;  // missing: NaN already
        if (plan.categorical[slot]) return category(plan, node, v, out, row);
        int rc = store_number(slot, node.path, v, out, row);
        if (rc != -1) return rc;
        if (v.type() == dom::element_type::STRING) {
            if (plan.cast[slot] == CAST_NUMBER)
                return cast_number(cast_parser_, slot, node.path, std::string_view(v), out,
                                   row);
            return fail_at(out, "bad_type", slot, node.path + " is a string; the feature is "
                           "a number (send a number, or declare cast: number in "
                           "source.fields)");
        }
        return fail_at(out, "bad_type", slot, node.path + " is an object or an array");
    }

    // a feature with categories (strings, in the model's code order): a string is its
    // category's position (NaN, counted: unseen); an integer only with cast: string (its
    // decimal digits are the category's text); any other value is bad_type
    int category(const Plan& plan, const Node& node, dom::element v, Out& out, float* row) {
        int slot = node.slot;
        char buf[32];
        std::string_view text;
        switch (v.type()) {
        case dom::element_type::STRING:
            text = std::string_view(v);
            break;
        case dom::element_type::INT64:
        case dom::element_type::UINT64:
            if (plan.cast[slot] != CAST_STRING)
                return fail_at(out, "bad_type", slot, node.path + " is a number; the "
                               "feature's categories are strings (send the category, or "
                               "declare cast: string in source.fields)");
            text = std::string_view(buf, v.type() == dom::element_type::INT64
                                    ? int_text(buf, sizeof buf, (long long)int64_t(v))
                                    : uint_text(buf, sizeof buf,
                                                (unsigned long long)uint64_t(v)));
            break;
        case dom::element_type::DOUBLE:
            if (plan.cast[slot] == CAST_STRING)
                return fail_at(out, "bad_type", slot, node.path + " is a number with a "
                               "fraction or an exponent: cast: string reads integers",
                               "cast_failed");
            return fail_at(out, "bad_type", slot, node.path + " is a number; the feature's "
                           "categories are strings (send the category, or declare cast: "
                           "string in source.fields)");
        case dom::element_type::BOOL:
            return fail_at(out, "bad_type", slot, node.path + " is true or false; the "
                           "feature's categories are strings");
        default:
            return fail_at(out, "bad_type", slot, node.path + " is an object or an array");
        }
        const auto& cats = plan.categories[slot];
        auto c = cats.find(std::string(text));
        if (c == cats.end()) {  // the libraries' unseen category: missing
            out.count_unseen(slot);
            return 0;
        }
        row[slot] = c->second;
        return 0;
    }

    // a hashed categorical feature's value (Plan.hashed): its text into out (append_cat);
    // null, and a number with no whole value, are missing
    int hashed(const Plan& plan, const Node& node, dom::element v, Out& out) {
        char buf[32];
        const char* s = buf;
        size_t len;
        switch (v.type()) {
        case dom::element_type::NULL_VALUE:
            return 0;
        case dom::element_type::BOOL:
            buf[0] = bool(v) ? '1' : '0';
            len = 1;
            break;
        case dom::element_type::INT64:
            len = int_text(buf, sizeof buf, (long long)int64_t(v));
            break;
        case dom::element_type::UINT64:
            len = uint_text(buf, sizeof buf, (unsigned long long)uint64_t(v));
            break;
        case dom::element_type::DOUBLE:
            len = whole_text(buf, sizeof buf, double(v));
            if (len == 0) return 0;
            break;
        case dom::element_type::STRING: {
            std::string_view sv(v);
            s = sv.data();
            len = sv.size();
            break;
        }
        default:
            return fail_at(out, "bad_type", node.slot, node.path + " is an object or an "
                           "array");
        }
        size_t f = (size_t)plan.n_features;
        // the rows' size was bounded by event(): this product cannot wrap
        size_t used = out.n_rows * (4 * f + 8) + out.id_bytes.size();
        if (!append_cat(out, (int64_t)((out.n_rows - 1) * f + (size_t)node.slot), s, len, used,
                        plan.max_bytes))
            return fail(out, "too_large", "more than " + std::to_string(plan.max_bytes) +
                        " bytes decoded (the message byte limit)");
        return 0;
    }

    int id(const Plan& plan, const Node& node, dom::element v, Out& out) {
        size_t r = out.n_rows - 1;
        out.id_reached = true;
        switch (v.type()) {
        case dom::element_type::NULL_VALUE:
            return 0;
        case dom::element_type::INT64:
            out.id_int[r] = int64_t(v);
            out.id_kind[r] = ID_INT;
            return 0;
        case dom::element_type::STRING: {
            std::string_view s(v);
            if (s.size() > (size_t)std::numeric_limits<int32_t>::max() - out.id_bytes.size())
                return fail(out, "too_large", node.path + ": ids over 2 GiB");
            // the rows' size was bounded by event(): this sum cannot wrap
            size_t rows_size = out.n_rows * (4 * (size_t)plan.n_features + 8);
            if (rows_size + out.id_bytes.size() + out.cat_size() + s.size() > plan.max_bytes)
                return fail(out, "too_large", "more than " + std::to_string(plan.max_bytes) +
                            " bytes decoded (the message byte limit)");
            out.id_bytes.append(s.data(), s.size());
            out.id_offsets[r + 1] = (int32_t)out.id_bytes.size();
            out.id_kind[r] = ID_STR;
            return 0;
        }
        default:
            return fail(out, "bad_type", node.path + ": an id is an integer of int64 or a "
                        "string");
        }
    }
};

// ---- out ----------------------------------------------------------------------------------

// a double as the shortest text that reads back to it (std::to_chars, Ryu in libstdc++); null
// where JSON has no number (NaN, infinities)
inline void append_double(std::string& out, double x) {
    if (!std::isfinite(x)) {
        out.append("null");
        return;
    }
    char buf[32];
    auto res = std::to_chars(buf, buf + sizeof buf, x);
    out.append(buf, (size_t)(res.ptr - buf));
}

inline void append_int(std::string& out, long long x) {
    char buf[24];
    auto res = std::to_chars(buf, buf + sizeof buf, x);
    out.append(buf, (size_t)(res.ptr - buf));
}

}  // namespace swjson
