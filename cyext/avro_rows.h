// Avro binary records (the body of a Confluent wire-format message, after its magic byte and
// schema id) straight into a row of float32 features, by a reader plan compiled once per
// writer schema (worker/formats/avro.py: fields resolved by name, so producers can evolve
// their schema). No Python object is made per field.
//
// The plan is the writer schema as a tree of nodes (flat arrays). A node that a feature or
// the id reads carries its slot; everything else is skipped. Values: int/long are cast to
// float32 from their int64, float as is, double as Arrow casts it (a finite double float32
// cannot hold is bad_number), boolean 1/0, null missing; strings and enum symbols of a
// feature with categories are the category's position (NaN: unseen); a CatBoost hashed
// feature's value is kept as the text CatBoost hashes (Out.cat_*). Every length, count
// and varint is bounded by the bytes left before it is used; a block of items that take no
// bytes is bounded by a fixed count, so no count in a message makes the reader loop long.
// The plan holds no field that takes no bytes (they are dropped when it is compiled), so
// every node visited is a record (at most 32 deep) or reads a byte: work is linear in the
// message.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "json_rows.h"  // Out, ID_* kinds

namespace swavro {

enum Kind : int32_t {
    NUL = 0, BOOLEAN = 1, INT = 2, LONG = 3, FLOAT = 4, DOUBLE = 5, BYTES = 6, STRING = 7,
    FIXED = 8, ENUM = 9, ARRAY = 10, MAP = 11, UNION = 12, RECORD = 13
};

struct Node {
    int32_t kind;
    int32_t slot;   // >= 0 a feature (a NUL too: the feature's null), -2 the id, -1 nothing
                    // reads it
    int64_t a;      // RECORD/UNION: first child in `children`; ARRAY/MAP: the item node;
                    // FIXED: size; ENUM: first code in `enum_codes`; NUL: first slot in
                    // `covers`
    int64_t b;      // RECORD/UNION: child count; ENUM: symbol count; STRING: category table
                    // (-1: cast: number); INT/LONG: category table (cast: string) or -1;
                    // NUL: covered slots (a null on their path: missing); ARRAY/MAP: 1 if
                    // an item takes a byte at least, 0 if it takes none and reads nothing
                    // (items skipped by count; their count bounded by MAX_EMPTY_ITEMS)
};

struct Plan {
    std::vector<Node> nodes;          // nodes[0]: the record
    std::vector<int32_t> children;
    std::vector<float> enum_codes;    // an enum's symbol -> its category code (or NaN)
    std::vector<std::string> symbols; // the same symbols' names (hashed features' texts)
    std::vector<std::unordered_map<std::string, float>> tables;  // a string's categories
    // feature slot -> 1: CatBoost's hashed categories, the value's text goes to Out.cat_*
    // (swjson::append_cat; the row keeps NaN) and the caller hashes it (formats/avro.py)
    std::vector<uint8_t> hashed;
    std::vector<int32_t> covers;      // NUL nodes' slots (a null on the way to them)
    std::vector<uint8_t> optional;    // slot -> 1: a record may leave it out (Out.absent)
    std::vector<std::string> labels;  // slot -> "feature 'x' (a.b)", for error details
    int n_features = 0;
    size_t max_bytes = 0;
};

// items in one message that take no bytes (an array of nulls): bounded, not by its bytes
static const uint64_t MAX_EMPTY_ITEMS = 1 << 20;

class Reader {
public:
    Reader() { init_ = cast_parser_.allocate(swjson::CAST_MAX + 1, 2); }

    // 0: one row in out; else out.code and out.detail say why
    int read(const Plan& plan, const uint8_t* data, size_t len, swjson::Out& out) {
        out.clear((size_t)plan.n_features);
        if (init_) return fail(out, "too_large", simdjson::error_message(init_));
        size_t f = (size_t)plan.n_features;
        if (4 * f + 8 + len > plan.max_bytes)
            return fail(out, "too_large", "more than " + std::to_string(plan.max_bytes) +
                        " bytes (the message byte limit)");
        out.rows.assign(f, std::numeric_limits<float>::quiet_NaN());
        out.id_int.assign(1, 0);
        out.id_kind.assign(1, swjson::ID_NULL);
        out.id_offsets.assign(2, 0);
        out.reached.assign(f, 0);
        out.n_rows = 1;
        out.single = true;
        p_ = data;
        end_ = data + len;
        empty_items_ = 0;
        int rc = value(plan, 0, out);
        if (rc) return rc;
        if (p_ != end_)
            return fail(out, "bad_avro", std::to_string(end_ - p_) +
                        " bytes after the record");
        // absent is not missing: the schema's check (formats/avro.py schema_mismatch) lets
        // no required feature go unread; an optional one a union's branch leaves out counts
        for (size_t s = 0; s < f; s++) {
            if (out.reached[s]) continue;
            if (!plan.optional[s])
                return swjson::fail_at(out, "missing_field", (int)s, plan.labels[s] +
                                       " is absent from the record");
            out.absent[s]++;
            out.counted = true;
        }
        return 0;
    }

private:
    simdjson::dom::parser cast_parser_;  // cast: number's strings (swjson::cast_number)
    simdjson::error_code init_;

    const uint8_t* p_ = nullptr;
    const uint8_t* end_ = nullptr;
    uint64_t empty_items_ = 0;

    static int fail(swjson::Out& out, const char* code, std::string detail) {
        out.code = code;
        out.detail = std::move(detail);
        return 1;
    }

    // A boolean's byte (0 or 1) and an int or long (an int within 32 bits), read as both
    // value() and hashed() read them: 0, or fail()'s / truncated()'s return.
    int boolean(uint8_t& b, swjson::Out& out) {
        if (p_ >= end_) return truncated(out);
        b = *p_++;
        if (b > 1) return fail(out, "bad_avro", "a boolean that is not 0 or 1");
        return 0;
    }

    int integer(const Node& n, int64_t& v, swjson::Out& out) {
        if (!varint(v)) return truncated(out);
        if (n.kind == INT && (v < INT32_MIN || v > INT32_MAX))
            return fail(out, "bad_avro", "an int outside 32 bits");
        return 0;
    }

    int truncated(swjson::Out& out) {
        if (overlong_) {
            overlong_ = false;
            return fail(out, "bad_avro", "a varint over 64 bits (more than 10 bytes)");
        }
        if (negative_) {
            negative_ = false;
            return fail(out, "bad_avro", "a negative length");
        }
        return fail(out, "bad_avro", "the record is cut short");
    }

    bool overlong_ = false;  // the last varint failed for its length, not for the bytes

    // a zigzag varint of at most 10 bytes (the spec's long)
    bool varint(int64_t& v) {
        uint64_t u = 0;
        overlong_ = false;
        for (int shift = 0; shift < 70; shift += 7) {
            if (p_ >= end_) return false;
            uint8_t byte = *p_++;
            if (shift == 63 && byte > 1) {  // more than 64 bits
                overlong_ = true;
                return false;
            }
            u |= (uint64_t)(byte & 0x7f) << shift;
            if (!(byte & 0x80)) {
                v = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
                return true;
            }
        }
        overlong_ = true;
        return false;
    }

    // a length (bytes, strings): non-negative and within the bytes left
    bool length(int64_t& n) {
        if (!varint(n)) return false;
        if (n < 0) {
            overlong_ = false;
            negative_ = true;
            return false;
        }
        return (uint64_t)n <= (uint64_t)(end_ - p_);
    }
    bool negative_ = false;

    int store(const Node& n, float x, swjson::Out& out) {
        if (n.slot >= 0) out.rows[n.slot] = x;
        return 0;
    }

    // a hashed categorical feature's value (Plan.hashed): its text into out, as
    // swjson::append_cat says (a string, an enum's symbol, an integer's digits, a whole
    // float's, a boolean's 1 or 0; any other number is missing); read as value() reads it
    int hashed(const Plan& plan, const Node& n, swjson::Out& out) {
        char buf[32];
        const char* s = buf;
        size_t len = 0;
        switch (n.kind) {
        case BOOLEAN: {
            uint8_t b;
            if (int e = boolean(b, out)) return e;
            buf[0] = b ? '1' : '0';
            len = 1;
            break;
        }
        case INT:
        case LONG: {
            int64_t v;
            if (int e = integer(n, v, out)) return e;
            len = swjson::int_text(buf, sizeof buf, (long long)v);
            break;
        }
        case FLOAT:
        case DOUBLE: {  // little-endian, as x86 and ARM are
            const int64_t w = n.kind == FLOAT ? 4 : 8;
            if (end_ - p_ < w) return truncated(out);
            double d;
            if (w == 4) {
                float x;
                std::memcpy(&x, p_, 4);
                d = x;
            } else {
                std::memcpy(&d, p_, 8);
            }
            p_ += w;
            len = swjson::whole_text(buf, sizeof buf, d);
            if (len == 0) return 0;
            break;
        }
        case STRING: {
            int64_t l;
            if (!length(l)) return truncated(out);
            s = (const char*)p_;
            p_ += l;
            if (!simdjson::validate_utf8(s, (size_t)l))
                return fail(out, "bad_avro", "a string that is not UTF-8");
            len = (size_t)l;
            break;
        }
        case ENUM: {
            int64_t k;
            if (!varint(k)) return truncated(out);
            if (k < 0 || k >= n.b) return fail(out, "bad_avro", "an enum index out of range");
            const std::string& sym = plan.symbols[(size_t)(n.a + k)];
            s = sym.data();
            len = sym.size();
            break;
        }
        default:  // the plan gives a hashed feature no other kind (formats/avro.py _check)
            return fail(out, "bad_avro", "a categorical feature of another type");
        }
        size_t used = 4 * (size_t)plan.n_features + 8 + out.id_bytes.size();
        if (!swjson::append_cat(out, n.slot, s, len, used, plan.max_bytes))
            return fail(out, "too_large", "more than " + std::to_string(plan.max_bytes) +
                        " bytes decoded (the message byte limit)");
        return 0;
    }

    // a category's text looked up in the feature's table: its code, or NaN (counted: unseen)
    int category(const Plan& plan, const Node& n, const char* s, size_t len,
                 swjson::Out& out) {
        const auto& cats = plan.tables[(size_t)n.b];
        auto c = cats.find(std::string(s, len));
        if (c == cats.end()) {
            out.count_unseen(n.slot);
            return 0;
        }
        return store(n, c->second, out);
    }

    int value(const Plan& plan, int32_t i, swjson::Out& out) {
        const Node& n = plan.nodes[i];
        if (n.slot >= 0) out.reached[(size_t)n.slot] = 1;
        if (n.slot >= 0 && plan.hashed[(size_t)n.slot] && n.kind != UNION && n.kind != NUL)
            return hashed(plan, n, out);
        switch (n.kind) {
        case NUL:  // a null on the way to features: each is missing
            for (int64_t k = 0; k < n.b; k++) out.reached[(size_t)plan.covers[n.a + k]] = 1;
            return 0;
        case BOOLEAN: {
            uint8_t b;
            if (int e = boolean(b, out)) return e;
            return store(n, b ? 1.0f : 0.0f, out);
        }
        case INT:
        case LONG: {
            int64_t v;
            if (int e = integer(n, v, out)) return e;
            if (n.slot == -2) {
                out.id_int[0] = v;
                out.id_kind[0] = swjson::ID_INT;
                return 0;
            }
            if (n.slot >= 0 && n.b >= 0) {  // cast: string, a category's decimal digits
                char buf[24];
                return category(plan, n, buf, swjson::int_text(buf, sizeof buf, (long long)v),
                                out);
            }
            return store(n, (float)v, out);
        }
        case FLOAT: {
            if (end_ - p_ < 4) return truncated(out);
            float x;
            std::memcpy(&x, p_, 4);  // little-endian, as x86 and ARM are
            p_ += 4;
            return store(n, x, out);
        }
        case DOUBLE: {
            if (end_ - p_ < 8) return truncated(out);
            double d;
            std::memcpy(&d, p_, 8);
            p_ += 8;
            float x = (float)d;
            if (n.slot >= 0 && std::isinf(x) && std::isfinite(d))
                return fail(out, "bad_number", "a double float32 cannot hold");
            return store(n, x, out);
        }
        case BYTES:
        case STRING: {
            int64_t len;
            if (!length(len)) return truncated(out);
            const char* s = (const char*)p_;
            p_ += len;
            // a string is UTF-8 (the spec; an id goes into an Arrow string array), read or not
            if (n.kind == STRING && !simdjson::validate_utf8(s, (size_t)len))
                return fail(out, "bad_avro", "a string that is not UTF-8");
            if (n.slot == -2) {
                // with the hashed texts read before it (Out.cat_size: each at most max_bytes)
                if ((size_t)len > plan.max_bytes ||
                    (size_t)len + out.cat_size() > plan.max_bytes ||
                    (uint64_t)len > (uint64_t)std::numeric_limits<int32_t>::max())
                    return fail(out, "too_large", "an id over the message byte limit");
                out.id_bytes.assign(s, (size_t)len);
                out.id_offsets[1] = (int32_t)len;
                out.id_kind[0] = swjson::ID_STR;
                return 0;
            }
            if (n.slot >= 0 && n.b < 0)  // cast: number, as the same text in JSON
                return swjson::cast_number(cast_parser_, n.slot, plan.labels[(size_t)n.slot],
                                           std::string_view(s, (size_t)len), out,
                                           out.rows.data());
            if (n.slot >= 0) return category(plan, n, s, (size_t)len, out);
            return 0;
        }
        case FIXED:
            if ((uint64_t)(end_ - p_) < (uint64_t)n.a) return truncated(out);
            p_ += n.a;
            return 0;
        case ENUM: {
            int64_t k;
            if (!varint(k)) return truncated(out);
            if (k < 0 || k >= n.b) return fail(out, "bad_avro", "an enum index out of range");
            float code = plan.enum_codes[n.a + k];
            if (n.slot >= 0 && std::isnan(code)) out.count_unseen(n.slot);
            return store(n, code, out);
        }
        case UNION: {
            int64_t k;
            if (!varint(k)) return truncated(out);
            if (k < 0 || k >= n.b) return fail(out, "bad_avro", "a union branch out of range");
            return value(plan, plan.children[n.a + k], out);
        }
        case RECORD:
            for (int64_t k = 0; k < n.b; k++) {
                int rc = value(plan, plan.children[n.a + k], out);
                if (rc) return rc;
            }
            return 0;
        case ARRAY:
        case MAP: {
            bool sized = n.b == 1;  // an item takes a byte at least (the plan says)
            for (;;) {
                int64_t count;
                if (!varint(count)) return truncated(out);
                if (count == 0) return 0;
                if (count < 0) {  // a block with its size in bytes: read and not needed
                    if (count == INT64_MIN) return fail(out, "bad_avro", "a bad block count");
                    count = -count;
                    int64_t size;
                    if (!varint(size)) return truncated(out);
                    if (size < 0 || (uint64_t)size > (uint64_t)(end_ - p_))
                        return fail(out, "bad_avro", "a block's byte size over the bytes left");
                }
                if (sized ? (uint64_t)count > (uint64_t)(end_ - p_)
                          : (empty_items_ += (uint64_t)count) > MAX_EMPTY_ITEMS)
                    return fail(out, "bad_avro", "a block of more items than the bytes left");
                if (!sized) continue;  // items that take no bytes and read nothing
                for (int64_t k = 0; k < count; k++) {
                    if (n.kind == MAP) {  // a key: a string, UTF-8 too
                        int64_t klen;
                        if (!length(klen)) return truncated(out);
                        if (!simdjson::validate_utf8((const char*)p_, (size_t)klen))
                            return fail(out, "bad_avro", "a map key that is not UTF-8");
                        p_ += klen;
                    }
                    int rc = value(plan, (int32_t)n.a, out);
                    if (rc) return rc;
                }
            }
        }
        default:
            return fail(out, "bad_avro", "a node of no known kind");
        }
    }
};

}  // namespace swavro
