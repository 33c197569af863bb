/*
 * The compiled OTLP trace decoder: protobuf ExportTraceServiceRequest bytes straight
 * into the collector's SpanData and SpanEvent objects, without building protobuf
 * message objects first (docs/performance.md, issue A5).
 *
 * It is an accelerator, not a second authority. The pure-Python decoder in
 * otlp_decode.py (protobuf's own parser, then decode_traces) is the reference: for any
 * input this module either returns exactly what the reference returns, or returns None
 * and the caller runs the reference. It returns None for everything it does not decode
 * exactly as protobuf does: malformed or truncated wire data (the reference then raises
 * with protobuf's message), a tag or a length prefix written in more than MAX_TAG_BYTES
 * bytes (protobuf refuses those too), invalid UTF-8 in any copy of a string (protobuf
 * checks every copy of a repeated singular field, not only the last, which it keeps),
 * groups, a known field with the wrong wire type, a singular message field sent twice
 * (protobuf merges those), more than one AnyValue member, values nested deeper than
 * MAX_VALUE_DEPTH, and a request whose table lookups would probe past PROBE_LIMIT slots.
 * tests/collector/test_otlp_native.py and fuzz/otlp_native_fuzz.py fuzz the two against
 * each other, on bytes and on structure-aware edits of valid requests.
 *
 * Like the reference it validates the whole request (every string, every nested
 * message, the spans it rejects included), applies the ingest limits in the same order,
 * drops GenAI content attributes and events unless kept, and counts all of it.
 * Strings, trace ids, integers and whole attribute sets are shared within one request
 * (keyed by their wire bytes in hash tables with a keyed hash, so a client cannot
 * choose colliding bytes), so buffered spans hold references, as in the reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define DONE 0
#define FALLBACK 1
#define FAILED (-1) /* a Python exception is set (memory) */
#define MAX_VALUE_DEPTH 16
#define SHARE_MAX_BYTES 64
#define MAX_TAG_BYTES 5 /* protobuf's limit for a tag's or a length's varint */

#define CHECK(expr)                        \
    do {                                   \
        int check_rc_ = (expr);            \
        if (check_rc_ != DONE) return check_rc_; \
    } while (0)

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Reader;

/* --- wire format ------------------------------------------------------------------ */

static inline int read_varint(Reader *r, uint64_t *out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end) return FALLBACK;
        uint8_t byte = *r->p++;
        if (shift == 63 && byte > 1) return FALLBACK;
        value |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = value;
            return DONE;
        }
    }
    return FALLBACK;
}

/* A tag or a length prefix. Protobuf refuses either when its varint takes more than 5
 * bytes, even padded ("\x8a\x80\x80\x80\x80\x00" is tag 10 in 6 bytes): so does this
 * (the reference then raises). Values (int64 and the like) may take 10, read_varint. */
static inline int read_varint32(Reader *r, uint64_t *out) {
    uint64_t value = 0;
    for (int i = 0; i < MAX_TAG_BYTES; i++) {
        if (r->p >= r->end) return FALLBACK;
        uint8_t byte = *r->p++;
        value |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) {
            *out = value;
            return DONE;
        }
    }
    return FALLBACK;
}

static inline int read_tag(Reader *r, uint32_t *field, int *wire_type) {
    uint64_t tag;
    CHECK(read_varint32(r, &tag));
    if (tag > UINT32_MAX || (tag >> 3) == 0) return FALLBACK;
    *field = (uint32_t)(tag >> 3);
    *wire_type = (int)(tag & 7);
    return DONE;
}

static inline int read_fixed64(Reader *r, uint64_t *out) {
    if (r->end - r->p < 8) return FALLBACK;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | r->p[i];
    r->p += 8;
    *out = v;
    return DONE;
}

static inline int read_fixed32(Reader *r, uint32_t *out) {
    if (r->end - r->p < 4) return FALLBACK;
    *out = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
           (uint32_t)r->p[3] << 24;
    r->p += 4;
    return DONE;
}

static inline int read_bytes(Reader *r, Reader *sub) {
    uint64_t n;
    CHECK(read_varint32(r, &n));
    if (n > (uint64_t)(r->end - r->p) || n >= INT32_MAX) return FALLBACK;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return DONE;
}

/* Skips one field of a wire type; groups (3, 4) are left to the reference. */
static int skip_field(Reader *r, int wire_type) {
    uint64_t ignored;
    Reader sub;
    switch (wire_type) {
    case 0: return read_varint(r, &ignored);
    case 1:
        if (r->end - r->p < 8) return FALLBACK;
        r->p += 8;
        return DONE;
    case 2: return read_bytes(r, &sub);
    case 5:
        if (r->end - r->p < 4) return FALLBACK;
        r->p += 4;
        return DONE;
    default: return FALLBACK;
    }
}

/* A known field must arrive with its own wire type (protobuf would keep it as unknown). */
#define EXPECT(wire_type, wanted) \
    do { if ((wire_type) != (wanted)) return FALLBACK; } while (0)

static int check_utf8(Reader s) {
    for (const uint8_t *q = s.p; q < s.end; q++) {
        if (*q & 0x80) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, NULL);
            if (text == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return FAILED;
                PyErr_Clear();
                return FALLBACK;
            }
            Py_DECREF(text);
            return DONE;
        }
    }
    return DONE;
}

static int new_text(Reader s, PyObject **out) {
    *out = PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, NULL);
    if (*out != NULL) return DONE;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return FAILED;
    PyErr_Clear();
    return FALLBACK;
}

static PyObject *new_hex(const uint8_t *p, Py_ssize_t n) {
    static const char digits[] = "0123456789abcdef";
    PyObject *text = PyUnicode_New(2 * n, 127);
    if (text == NULL) return NULL;
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(text);
    for (Py_ssize_t i = 0; i < n; i++) {
        w[2 * i] = (Py_UCS1)digits[p[i] >> 4];
        w[2 * i + 1] = (Py_UCS1)digits[p[i] & 15];
    }
    return text;
}

/* --- per-request tables, keyed by wire bytes --------------------------------------- */

/* The tables are keyed by bytes the client chose (trace ids, attribute sets), so their
 * hash is keyed: SipHash-1-3, the function CPython hashes str and bytes with, under a
 * random key drawn once per process when the module is imported. A client that cannot
 * learn the key cannot choose bytes that collide. Probing is bounded besides: a lookup
 * that would look at more than PROBE_LIMIT slots gives the request up (FALLBACK), and
 * the reference decoder, linear in the request's size, decides it. With tables at most
 * half full and a random hash the longest probe run of a 100,000-entry table is about 50
 * slots, so no honest request is expected to reach the limit, and none can cost more
 * than PROBE_LIMIT slots a lookup. (The unkeyed hash this replaced let 80,000 trace ids
 * chosen to collide cost 27 to 38 s of CPU in one 2.6 MB request, against 0.13 to 0.15 s
 * for random ids; bench/hash_flood.py, docs/security.md.) */
#define PROBE_LIMIT 128

static uint64_t hash_key[2]; /* drawn at import (os.urandom) */
static size_t last_longest_probe; /* of the last decode_traces call, for tests */

/* 8 bytes as a little-endian number (one load where the machine is little-endian). */
static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                  \
    do {                                                          \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32); \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                    \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                    \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32); \
    } while (0)

/* SipHash-1-3 of n bytes under the key (k0, k1): one round a word, three to finish. */
static uint64_t siphash13(uint64_t k0, uint64_t k1, const uint8_t *p, size_t n) {
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL;
    uint64_t v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL;
    uint64_t v3 = k1 ^ 0x7465646279746573ULL;
    const uint8_t *words_end = p + (n & ~(size_t)7);
    for (; p < words_end; p += 8) {
        uint64_t m = load_le64(p);
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t last = (uint64_t)n << 56; /* the length's low byte, then the tail bytes */
    for (size_t i = 0; i < (n & 7); i++) last |= (uint64_t)p[i] << (8 * i);
    v3 ^= last;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static inline uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n) {
    return siphash13(hash_key[0], hash_key[1], p, (size_t)n);
}

typedef struct {
    uint64_t hash;
    const uint8_t *p; /* into the request body, which outlives the call */
    Py_ssize_t n;
    PyObject *obj; /* NULL: empty slot */
    long counts[3]; /* what decoding it counted (attribute sets), or flags */
} Entry;

typedef struct {
    Entry *slots;
    size_t mask;
    size_t used;
    size_t longest_probe; /* slots looked at by the longest lookup so far */
} Table;

static int table_init(Table *t, size_t capacity) {
    t->slots = PyMem_Calloc(capacity, sizeof(Entry));
    if (t->slots == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    t->mask = capacity - 1;
    t->used = 0;
    t->longest_probe = 0;
    return DONE;
}

static void table_free(Table *t) {
    if (t->slots == NULL) return;
    for (size_t i = 0; i <= t->mask; i++) Py_XDECREF(t->slots[i].obj);
    PyMem_Free(t->slots);
    t->slots = NULL;
}

/* The entry for these bytes, or the empty slot where they would go; NULL where that
 * would take more than PROBE_LIMIT slots (the caller then returns FALLBACK). */
static Entry *table_find(Table *t, const uint8_t *p, Py_ssize_t n, uint64_t h) {
    size_t i = (size_t)h & t->mask;
    for (size_t probes = 1; probes <= PROBE_LIMIT; probes++) {
        Entry *e = &t->slots[i];
        if (e->obj == NULL ||
            (e->hash == h && e->n == n && memcmp(e->p, p, (size_t)n) == 0)) {
            if (probes > t->longest_probe) t->longest_probe = probes;
            return e;
        }
        i = (i + 1) & t->mask;
    }
    t->longest_probe = PROBE_LIMIT + 1;
    return NULL;
}

/* Fills an empty slot found by table_find (steals ``obj``, which the table then owns
 * whatever this returns); grows at half full. *placed: where the entry is now. */
static int table_put(Table *t, Entry *slot, const uint8_t *p, Py_ssize_t n, uint64_t h,
                     PyObject *obj, const long counts[3], Entry **placed) {
    slot->hash = h;
    slot->p = p;
    slot->n = n;
    slot->obj = obj;
    memcpy(slot->counts, counts, sizeof slot->counts);
    *placed = slot;
    if (++t->used * 2 <= t->mask + 1) return DONE;
    Table bigger;
    CHECK(table_init(&bigger, 2 * (t->mask + 1)));
    bigger.longest_probe = t->longest_probe;
    for (size_t i = 0; i <= t->mask; i++) {
        Entry *e = &t->slots[i];
        if (e->obj == NULL) continue;
        Entry *moved = table_find(&bigger, e->p, e->n, e->hash);
        if (moved == NULL) { /* the entries are still this table's: none moved yet */
            t->longest_probe = bigger.longest_probe;
            PyMem_Free(bigger.slots);
            return FALLBACK;
        }
        *moved = *e;
        if (e == slot) *placed = moved;
    }
    bigger.used = t->used;
    PyMem_Free(t->slots);
    *t = bigger;
    return DONE;
}


/* --- the decoder's state ------------------------------------------------------------ */

typedef struct {
    /* configuration (borrowed) */
    Py_ssize_t max_attributes;
    Py_ssize_t max_value_length;
    Py_ssize_t max_events;
    int keep_content;
    PyObject *content_prefixes; /* tuple of bytes */
    PyObject *content_event_names; /* frozenset of str */
    PyTypeObject *span_type;
    PyTypeObject *event_type;
    PyObject *span_fields; /* tuple of 12 str */
    PyObject *event_fields; /* tuple of 3 str */
    PyObject *no_attributes; /* the shared empty dict */
    PyObject *no_events; /* () */
    /* tables */
    Table keys; /* raw key -> key str (Py_None: a content key, dropped) */
    Table texts; /* raw short string value -> str (counts[0]: it was truncated) */
    Table names; /* span and event names (counts[0]: 1 content event, 2 not) */
    Table ids; /* trace and parent ids -> hex */
    Table ints; /* varint bytes -> int */
    Table attribute_sets; /* KeyValue run -> dict (counts: dropped, content, truncated) */
    /* counts */
    long attributes_dropped;
    long content_attributes_dropped;
    long values_truncated;
    long events_dropped;
    long content_events_dropped;
    long rejected[3]; /* trace_id, span_id, parent_span_id */
} Decoder;

static int any_value(Decoder *d, Reader r, int depth, PyObject **out);

/* --- validation only (what protobuf would check in data the pipeline does not read) -- */

static int check_any_value(Reader r, int depth);

/* The next field of a message whose fields numbered in ``len_fields`` (a bit each) are
 * all length-delimited: its number, and its bytes in ``s``; fields of other numbers are
 * skipped (unknown). *field is 0 at the end of the message. */
static int next_field(Reader *r, uint32_t len_fields, uint32_t *field, Reader *s) {
    while (r->p < r->end) {
        int wt;
        CHECK(read_tag(r, field, &wt));
        if (*field < 32 && (len_fields >> *field) & 1) {
            EXPECT(wt, 2);
            return read_bytes(r, s);
        }
        CHECK(skip_field(r, wt));
    }
    *field = 0;
    return DONE;
}

#define BIT(n) (1u << (n))

static int check_key_value(Reader r, int depth) {
    int value_seen = 0;
    while (r.p < r.end) {
        uint32_t field;
        int wt;
        Reader s;
        CHECK(read_tag(&r, &field, &wt));
        if (field == 1) {
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            CHECK(check_utf8(s));
        } else if (field == 2) {
            EXPECT(wt, 2);
            if (value_seen++) return FALLBACK;
            CHECK(read_bytes(&r, &s));
            CHECK(check_any_value(s, depth + 1));
        } else if (field == 3) {
            EXPECT(wt, 0);
            CHECK(skip_field(&r, wt));
        } else {
            CHECK(skip_field(&r, wt));
        }
    }
    return DONE;
}

/* Every field of a message is the same repeated KeyValue (field ``number``) or other. */
static int check_key_values(Reader r, uint32_t number, int depth) {
    uint32_t field;
    Reader s;
    for (;;) {
        CHECK(next_field(&r, BIT(number), &field, &s));
        if (!field) return DONE;
        CHECK(check_key_value(s, depth + 1));
    }
}

static int check_any_value(Reader r, int depth) {
    if (depth > MAX_VALUE_DEPTH) return FALLBACK;
    int members = 0;
    while (r.p < r.end) {
        uint32_t field;
        int wt;
        Reader s;
        uint64_t ignored;
        CHECK(read_tag(&r, &field, &wt));
        if (field >= 1 && field <= 8 && members++) return FALLBACK;
        switch (field) {
        case 1:
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            CHECK(check_utf8(s));
            break;
        case 2: case 3: case 8:
            EXPECT(wt, 0);
            CHECK(read_varint(&r, &ignored));
            break;
        case 4:
            EXPECT(wt, 1);
            CHECK(skip_field(&r, wt));
            break;
        case 5: case 6:
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            if (field == 5) {
                for (;;) { /* ArrayValue: values = 1 */
                    uint32_t f;
                    Reader item;
                    CHECK(next_field(&s, BIT(1), &f, &item));
                    if (!f) break;
                    CHECK(check_any_value(item, depth + 1));
                }
            } else {
                CHECK(check_key_values(s, 1, depth + 1)); /* KeyValueList */
            }
            break;
        case 7:
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            break;
        default:
            CHECK(skip_field(&r, wt));
        }
    }
    return DONE;
}

/* A message whose known fields are strings (numbers listed in ``strings``, a bit each),
 * varints, fixed32 or repeated KeyValue, as InstrumentationScope, Link, Status, EntityRef. */
typedef struct {
    uint32_t strings; /* bit n: field n is a string (or repeated string) */
    uint32_t bytes;
    uint32_t varints;
    uint32_t fixed32s;
    uint32_t key_values;
} Shape;

static const Shape SCOPE_SHAPE = {1u << 1 | 1u << 2, 0, 1u << 4, 0, 1u << 3};
static const Shape LINK_SHAPE = {1u << 3, 1u << 1 | 1u << 2, 1u << 5, 1u << 6, 1u << 4};
static const Shape STATUS_SHAPE = {1u << 2, 0, 1u << 3, 0, 0};
static const Shape ENTITY_REF_SHAPE = {1u << 1 | 1u << 2 | 1u << 3 | 1u << 4, 0, 0, 0, 0};

static int check_shape(Reader r, const Shape *shape) {
    while (r.p < r.end) {
        uint32_t field;
        int wt;
        Reader s;
        CHECK(read_tag(&r, &field, &wt));
        uint32_t bit = field < 32 ? 1u << field : 0;
        if (bit & (shape->strings | shape->bytes | shape->key_values)) {
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            if (bit & shape->strings) CHECK(check_utf8(s));
            if (bit & shape->key_values) CHECK(check_key_value(s, 1));
        } else if (bit & shape->varints) {
            EXPECT(wt, 0);
            CHECK(skip_field(&r, wt));
        } else if (bit & shape->fixed32s) {
            EXPECT(wt, 5);
            CHECK(skip_field(&r, wt));
        } else {
            CHECK(skip_field(&r, wt));
        }
    }
    return DONE;
}

/* --- attribute values ------------------------------------------------------------------ */

/* The entry for these bytes in a per-request table, made by ``make`` the first time. */
typedef int (*MakeFn)(Decoder *d, Reader s, PyObject **obj, long counts[3]);

static int interned(Decoder *d, Table *t, Reader s, MakeFn make, Entry **out) {
    Py_ssize_t n = s.end - s.p;
    uint64_t h = hash_bytes(s.p, n);
    Entry *e = table_find(t, s.p, n, h);
    if (e == NULL) return FALLBACK;
    if (e->obj == NULL) {
        PyObject *obj;
        long counts[3] = {0, 0, 0};
        CHECK(make(d, s, &obj, counts));
        CHECK(table_put(t, e, s.p, n, h, obj, counts, &e));
    }
    *out = e;
    return DONE;
}

/* A string value cut to the value length limit (counts[0]: it was cut). */
static int make_value_text(Decoder *d, Reader s, PyObject **out, long counts[3]) {
    PyObject *text;
    CHECK(new_text(s, &text));
    if (PyUnicode_GET_LENGTH(text) > d->max_value_length) {
        PyObject *cut = PyUnicode_Substring(text, 0, d->max_value_length);
        Py_DECREF(text);
        if (cut == NULL) return FAILED;
        text = cut;
        counts[0] = 1;
    }
    *out = text;
    return DONE;
}

static int make_text(Decoder *d, Reader s, PyObject **out, long counts[3]) {
    (void)d;
    (void)counts;
    return new_text(s, out);
}

static int make_hex(Decoder *d, Reader s, PyObject **out, long counts[3]) {
    (void)d;
    (void)counts;
    *out = new_hex(s.p, s.end - s.p);
    return *out == NULL ? FAILED : DONE;
}

/* An int64 from the bytes of its varint. */
static int make_int(Decoder *d, Reader s, PyObject **out, long counts[3]) {
    (void)d;
    (void)counts;
    uint64_t raw;
    CHECK(read_varint(&s, &raw));
    *out = PyLong_FromLongLong((long long)(int64_t)raw);
    return *out == NULL ? FAILED : DONE;
}

/* Short values are shared within the request; longer ones are made each time. */
static int string_value(Decoder *d, Reader s, PyObject **out) {
    long counts[3] = {0, 0, 0};
    if (s.end - s.p > SHARE_MAX_BYTES) {
        CHECK(make_value_text(d, s, out, counts));
        d->values_truncated += counts[0];
        return DONE;
    }
    Entry *e;
    CHECK(interned(d, &d->texts, s, make_value_text, &e));
    d->values_truncated += e->counts[0];
    Py_INCREF(e->obj);
    *out = e->obj;
    return DONE;
}

static int shared_value(Decoder *d, Table *t, Reader s, MakeFn make, PyObject **out) {
    Entry *e;
    CHECK(interned(d, t, s, make, &e));
    Py_INCREF(e->obj);
    *out = e->obj;
    return DONE;
}

static int array_value(Decoder *d, Reader r, int depth, PyObject **out) {
    PyObject *items = PyList_New(0);
    if (items == NULL) return FAILED;
    Py_ssize_t count = 0;
    int rc = DONE;
    for (;;) {
        uint32_t field;
        Reader s;
        if ((rc = next_field(&r, BIT(1), &field, &s)) != DONE || !field) break;
        if (count++ >= d->max_value_length) { /* arrays: items past the cap are checked only */
            if ((rc = check_any_value(s, depth + 1)) != DONE) break;
            continue;
        }
        PyObject *item = NULL;
        if ((rc = any_value(d, s, depth + 1, &item)) != DONE) break;
        if (item != NULL) {
            int failed = PyList_Append(items, item);
            Py_DECREF(item);
            if (failed) { rc = FAILED; break; }
        }
    }
    if (rc != DONE) {
        Py_DECREF(items);
        return rc;
    }
    if (count > d->max_value_length) d->values_truncated++;
    *out = PyList_AsTuple(items);
    Py_DECREF(items);
    return *out == NULL ? FAILED : DONE;
}

/* An AnyValue as the reference's _AttributeReader.value(); *out stays NULL for nothing
 * the pipeline reads (no value, a kvlist, a string table index). */
static int any_value(Decoder *d, Reader r, int depth, PyObject **out) {
    if (depth > MAX_VALUE_DEPTH) return FALLBACK;
    uint32_t member = 0;
    Reader s = {NULL, NULL};
    uint64_t number = 0;
    const uint8_t *number_start = NULL, *number_stop = NULL;
    while (r.p < r.end) {
        uint32_t field;
        int wt;
        CHECK(read_tag(&r, &field, &wt));
        if (field < 1 || field > 8) {
            CHECK(skip_field(&r, wt));
            continue;
        }
        if (member) return FALLBACK;
        member = field;
        switch (field) {
        case 1: case 5: case 6: case 7:
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            break;
        case 4:
            EXPECT(wt, 1);
            CHECK(read_fixed64(&r, &number));
            break;
        default: /* 2 bool, 3 int, 8 string index */
            EXPECT(wt, 0);
            number_start = r.p;
            CHECK(read_varint(&r, &number));
            number_stop = r.p;
        }
    }
    *out = NULL;
    switch (member) {
    case 1: return string_value(d, s, out);
    case 2:
        *out = number ? Py_True : Py_False;
        Py_INCREF(*out);
        return DONE;
    case 3: return shared_value(d, &d->ints, (Reader){number_start, number_stop}, make_int,
                                out);
    case 4: {
        double value;
        memcpy(&value, &number, sizeof value);
        *out = PyFloat_FromDouble(value);
        return *out == NULL ? FAILED : DONE;
    }
    case 5: return array_value(d, s, depth, out);
    case 6: return check_key_values(s, 1, depth + 1);
    case 7: {
        Py_ssize_t n = s.end - s.p;
        if (2 * n > d->max_value_length) {
            d->values_truncated++;
            n = d->max_value_length / 2;
        }
        *out = new_hex(s.p, n);
        return *out == NULL ? FAILED : DONE;
    }
    default: return DONE;
    }
}

/* --- attribute sets -------------------------------------------------------------------- */

/* A run of one repeated field inside a message: [start, stop) holds only that field's
 * occurrences when ``contiguous``, else they are spread over the whole message. */
typedef struct {
    const uint8_t *start;
    const uint8_t *stop;
    long count;
    int contiguous;
} Run;

static inline void run_add(Run *run, const uint8_t *tag_start, const uint8_t *stop) {
    if (run->count++ == 0) {
        run->start = tag_start;
        run->contiguous = 1;
    } else if (tag_start != run->stop) {
        run->contiguous = 0;
    }
    run->stop = stop;
}

/* The next occurrence of field ``number`` (length-delimited) in ``r``. */
static int next_in_run(Reader *r, uint32_t number, Reader *s, int *found) {
    uint32_t field;
    CHECK(next_field(r, BIT(number), &field, s));
    *found = field != 0;
    return DONE;
}

/* A key as stored, or Py_None for a GenAI content key (dropped unless content is kept). */
static int make_key(Decoder *d, Reader s, PyObject **out, long counts[3]) {
    (void)counts;
    if (!d->keep_content) {
        Py_ssize_t n = s.end - s.p, count = PyTuple_GET_SIZE(d->content_prefixes);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *prefix = PyTuple_GET_ITEM(d->content_prefixes, i);
            Py_ssize_t m = PyBytes_GET_SIZE(prefix);
            if (m <= n && memcmp(s.p, PyBytes_AS_STRING(prefix), (size_t)m) == 0) {
                CHECK(check_utf8(s));
                Py_INCREF(Py_None);
                *out = Py_None;
                return DONE;
            }
        }
    }
    return new_text(s, out);
}

static int admitted_key(Decoder *d, Reader s, PyObject **key) {
    Entry *e;
    CHECK(interned(d, &d->keys, s, make_key, &e));
    *key = e->obj; /* borrowed; Py_None for a content key */
    return DONE;
}

/* Decodes the KeyValues of a run into a new dict, counting into ``counts``. */
static int decode_attributes(Decoder *d, Reader message, uint32_t number, const Run *run,
                             PyObject *out, long counts[3]) {
    Reader r = run->contiguous ? (Reader){run->start, run->stop} : message;
    for (;;) {
        Reader kv;
        int found;
        CHECK(next_in_run(&r, number, &kv, &found));
        if (!found) return DONE;
        Reader raw_key = {kv.p, kv.p}, value = {NULL, NULL};
        int value_seen = 0;
        while (kv.p < kv.end) {
            uint32_t field;
            int wt;
            CHECK(read_tag(&kv, &field, &wt));
            if (field == 1) { /* the last copy wins; protobuf checks every copy */
                EXPECT(wt, 2);
                CHECK(check_utf8(raw_key));
                CHECK(read_bytes(&kv, &raw_key));
            } else if (field == 2) {
                EXPECT(wt, 2);
                if (value_seen++) return FALLBACK;
                CHECK(read_bytes(&kv, &value));
            } else {
                if (field == 3) EXPECT(wt, 0);
                CHECK(skip_field(&kv, wt));
            }
        }
        PyObject *key;
        CHECK(admitted_key(d, raw_key, &key));
        if (key == Py_None) {
            counts[1]++;
            if (value_seen) CHECK(check_any_value(value, 1));
            continue;
        }
        if (PyDict_GET_SIZE(out) >= d->max_attributes) {
            counts[0]++;
            if (value_seen) CHECK(check_any_value(value, 1));
            continue;
        }
        if (!value_seen) continue;
        long truncated_before = d->values_truncated;
        PyObject *item = NULL;
        CHECK(any_value(d, value, 1, &item));
        counts[2] += d->values_truncated - truncated_before;
        d->values_truncated = truncated_before;
        if (item == NULL) continue;
        int failed = PyDict_SetItem(out, key, item);
        Py_DECREF(item);
        if (failed) return FAILED;
    }
}

/* The attributes of a message as a dict shared with every equal run in this request. */
static int attributes(Decoder *d, Reader message, uint32_t number, const Run *run,
                      PyObject **out) {
    if (run->count == 0) {
        Py_INCREF(d->no_attributes);
        *out = d->no_attributes;
        return DONE;
    }
    Entry *e = NULL;
    uint64_t h = 0;
    Py_ssize_t n = run->stop - run->start;
    if (run->contiguous) {
        h = hash_bytes(run->start, n);
        e = table_find(&d->attribute_sets, run->start, n, h);
        if (e == NULL) return FALLBACK;
        if (e->obj != NULL) goto found;
    }
    PyObject *dict = PyDict_New();
    if (dict == NULL) return FAILED;
    long counts[3] = {0, 0, 0};
    int rc = decode_attributes(d, message, number, run, dict, counts);
    if (rc != DONE) {
        Py_DECREF(dict);
        return rc;
    }
    if (PyDict_GET_SIZE(dict) == 0) {
        Py_DECREF(dict);
        dict = d->no_attributes;
        Py_INCREF(dict);
    }
    if (e == NULL) {
        d->attributes_dropped += counts[0];
        d->content_attributes_dropped += counts[1];
        d->values_truncated += counts[2];
        *out = dict;
        return DONE;
    }
    CHECK(table_put(&d->attribute_sets, e, run->start, n, h, dict, counts, &e));
found:
    d->attributes_dropped += e->counts[0];
    d->content_attributes_dropped += e->counts[1];
    d->values_truncated += e->counts[2];
    Py_INCREF(e->obj);
    *out = e->obj;
    return DONE;
}

/* Every KeyValue of a run checked, none decoded (a rejected span's, a dropped event's). */
static int check_run(Reader message, uint32_t number, const Run *run) {
    Reader r = run->contiguous ? (Reader){run->start, run->stop} : message;
    for (;;) {
        Reader kv;
        int found;
        CHECK(next_in_run(&r, number, &kv, &found));
        if (!found) return DONE;
        CHECK(check_key_value(kv, 1));
    }
}

/* --- objects ------------------------------------------------------------------------ */

/* A slotted dataclass instance with its fields set from ``values`` (stolen). */
static PyObject *new_record(PyTypeObject *type, PyObject *fields, PyObject **values,
                            Py_ssize_t n) {
    PyObject *obj = type->tp_alloc(type, 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (obj != NULL && PyObject_GenericSetAttr(obj, PyTuple_GET_ITEM(fields, i),
                                                   values[i]) < 0) {
            Py_CLEAR(obj);
        }
        Py_DECREF(values[i]);
    }
    return obj;
}

static int shared_name(Decoder *d, Reader s, Entry **out) {
    return interned(d, &d->names, s, make_text, out);
}

/* --- events ------------------------------------------------------------------------- */

typedef struct {
    uint64_t time;
    Reader name;
    Run attributes;
} EventFields;

static int scan_event(Reader r, EventFields *ev) {
    memset(ev, 0, sizeof *ev);
    ev->name.p = ev->name.end = r.p;
    while (r.p < r.end) {
        const uint8_t *tag_start = r.p;
        uint32_t field;
        int wt;
        Reader s;
        CHECK(read_tag(&r, &field, &wt));
        switch (field) {
        case 1: EXPECT(wt, 1); CHECK(read_fixed64(&r, &ev->time)); break;
        case 2: /* the last copy wins; an earlier one is checked as it is replaced */
            EXPECT(wt, 2);
            CHECK(check_utf8(ev->name));
            CHECK(read_bytes(&r, &ev->name));
            break;
        case 3:
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            run_add(&ev->attributes, tag_start, r.p);
            break;
        case 4: EXPECT(wt, 0); CHECK(skip_field(&r, wt)); break;
        default: CHECK(skip_field(&r, wt));
        }
    }
    return DONE;
}

/* The events of an accepted span into ``events`` (a list), as the reference's _read_events. */
static int decode_events(Decoder *d, Reader span, const Run *run, PyObject *events) {
    Reader r = run->contiguous ? (Reader){run->start, run->stop} : span;
    for (;;) {
        Reader raw;
        int found;
        CHECK(next_in_run(&r, 11, &raw, &found));
        if (!found) return DONE;
        EventFields ev;
        CHECK(scan_event(raw, &ev));
        Entry *name;
        CHECK(shared_name(d, ev.name, &name));
        if (!d->keep_content) {
            if (name->counts[0] == 0) {
                int content = PySet_Contains(d->content_event_names, name->obj);
                if (content < 0) return FAILED;
                name->counts[0] = content ? 1 : 2;
            }
            if (name->counts[0] == 1) {
                d->content_events_dropped++;
                CHECK(check_run(raw, 3, &ev.attributes));
                continue;
            }
        }
        if (PyList_GET_SIZE(events) >= d->max_events) {
            d->events_dropped++;
            CHECK(check_run(raw, 3, &ev.attributes));
            continue;
        }
        PyObject *values[3] = {name->obj, PyLong_FromUnsignedLongLong(ev.time), NULL};
        Py_INCREF(values[0]);
        if (values[1] == NULL) {
            Py_DECREF(values[0]);
            return FAILED;
        }
        int rc = attributes(d, raw, 3, &ev.attributes, &values[2]);
        if (rc != DONE) {
            Py_DECREF(values[0]);
            Py_DECREF(values[1]);
            return rc;
        }
        PyObject *event = new_record(d->event_type, d->event_fields, values, 3);
        if (event == NULL) return FAILED;
        int failed = PyList_Append(events, event);
        Py_DECREF(event);
        if (failed) return FAILED;
    }
}

/* --- spans ---------------------------------------------------------------------------- */

#define REMOTE_PARENT_FLAGS (0x100u | 0x200u)

typedef struct {
    Reader trace_id, span_id, parent, name, status;
    int status_seen;
    uint64_t kind, start, end;
    uint32_t flags;
    Run attributes, events;
} SpanFields;

static int scan_span(Reader r, SpanFields *f) {
    memset(f, 0, sizeof *f);
    f->trace_id.p = f->trace_id.end = f->span_id.p = f->span_id.end = r.p;
    f->parent.p = f->parent.end = f->name.p = f->name.end = r.p;
    while (r.p < r.end) {
        const uint8_t *tag_start = r.p;
        uint32_t field;
        int wt;
        Reader s;
        CHECK(read_tag(&r, &field, &wt));
        switch (field) {
        case 1: EXPECT(wt, 2); CHECK(read_bytes(&r, &f->trace_id)); break;
        case 2: EXPECT(wt, 2); CHECK(read_bytes(&r, &f->span_id)); break;
        case 3: EXPECT(wt, 2); CHECK(read_bytes(&r, &s)); CHECK(check_utf8(s)); break;
        case 4: EXPECT(wt, 2); CHECK(read_bytes(&r, &f->parent)); break;
        case 5: /* the last copy wins; an earlier one is checked as it is replaced */
            EXPECT(wt, 2);
            CHECK(check_utf8(f->name));
            CHECK(read_bytes(&r, &f->name));
            break;
        case 6: EXPECT(wt, 0); CHECK(read_varint(&r, &f->kind)); break;
        case 7: EXPECT(wt, 1); CHECK(read_fixed64(&r, &f->start)); break;
        case 8: EXPECT(wt, 1); CHECK(read_fixed64(&r, &f->end)); break;
        case 9:
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            run_add(&f->attributes, tag_start, r.p);
            break;
        case 11:
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            run_add(&f->events, tag_start, r.p);
            break;
        case 10: case 12: case 14: EXPECT(wt, 0); CHECK(skip_field(&r, wt)); break;
        case 13:
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            CHECK(check_shape(s, &LINK_SHAPE));
            break;
        case 15:
            EXPECT(wt, 2);
            if (f->status_seen++) return FALLBACK;
            CHECK(read_bytes(&r, &f->status));
            CHECK(check_shape(f->status, &STATUS_SHAPE));
            break;
        case 16: EXPECT(wt, 5); CHECK(read_fixed32(&r, &f->flags)); break;
        default: CHECK(skip_field(&r, wt));
        }
    }
    return DONE;
}

static int is_zero(Reader s) {
    for (const uint8_t *q = s.p; q < s.end; q++)
        if (*q) return 0;
    return 1;
}

static long status_code(Reader status) {
    uint64_t code = 0;
    while (status.p < status.end) {
        uint32_t field;
        int wt;
        uint64_t v;
        if (read_tag(&status, &field, &wt) != DONE) break;
        if (field == 3 && wt == 0) {
            if (read_varint(&status, &v) != DONE) break;
            code = v;
        } else if (skip_field(&status, wt) != DONE) {
            break;
        }
    }
    return (long)(int32_t)(uint32_t)code; /* an open enum: any int32 (checked by scan) */
}

/* Checks everything a rejected span carries, as protobuf parses it before it is refused. */
static int check_rejected_span(Reader span, const SpanFields *f) {
    CHECK(check_utf8(f->name));
    CHECK(check_run(span, 9, &f->attributes));
    Reader r = f->events.contiguous ? (Reader){f->events.start, f->events.stop} : span;
    for (;;) {
        Reader raw;
        int found;
        CHECK(next_in_run(&r, 11, &raw, &found));
        if (!found) return DONE;
        EventFields ev;
        CHECK(scan_event(raw, &ev));
        CHECK(check_utf8(ev.name));
        CHECK(check_run(raw, 3, &ev.attributes));
    }
}

static int decode_span(Decoder *d, Reader span, PyObject *resource, PyObject *spans) {
    SpanFields f;
    CHECK(scan_span(span, &f));
    int reason = -1;
    if (f.trace_id.end - f.trace_id.p != 16 || is_zero(f.trace_id)) reason = 0;
    else if (f.span_id.end - f.span_id.p != 8 || is_zero(f.span_id)) reason = 1;
    else if (f.parent.end != f.parent.p && f.parent.end - f.parent.p != 8) reason = 2;
    if (reason >= 0) {
        d->rejected[reason]++;
        return check_rejected_span(span, &f);
    }
    PyObject *values[12] = {NULL};
    int rc = shared_value(d, &d->ids, f.trace_id, make_hex, &values[0]);
    if (rc != DONE) return rc;
    rc = FAILED;
    if ((values[1] = new_hex(f.span_id.p, 8)) == NULL) goto fail;
    if (f.parent.end != f.parent.p && !is_zero(f.parent)) {
        if ((rc = shared_value(d, &d->ids, f.parent, make_hex, &values[2])) != DONE) goto fail;
        rc = FAILED;
    } else {
        values[2] = PyUnicode_New(0, 0);
        if (values[2] == NULL) goto fail;
    }
    Entry *name;
    if ((rc = shared_name(d, f.name, &name)) != DONE) goto fail;
    rc = FAILED;
    values[3] = name->obj;
    Py_INCREF(values[3]);
    if ((values[4] = PyLong_FromLong((long)(int32_t)(uint32_t)f.kind)) == NULL) goto fail;
    if ((values[5] = PyLong_FromUnsignedLongLong(f.start)) == NULL) goto fail;
    values[6] = PyLong_FromUnsignedLongLong(f.end > f.start ? f.end : f.start);
    if (values[6] == NULL) goto fail;
    if ((rc = attributes(d, span, 9, &f.attributes, &values[7])) != DONE) goto fail;
    rc = FAILED;
    if (f.events.count) {
        if ((values[8] = PyList_New(0)) == NULL) goto fail;
        if ((rc = decode_events(d, span, &f.events, values[8])) != DONE) goto fail;
        rc = FAILED;
    } else {
        values[8] = d->no_events;
        Py_INCREF(values[8]);
    }
    values[9] = resource;
    Py_INCREF(resource);
    if ((values[10] = PyLong_FromLong(f.status_seen ? status_code(f.status) : 0)) == NULL)
        goto fail;
    values[11] = (f.flags & REMOTE_PARENT_FLAGS) == REMOTE_PARENT_FLAGS ? Py_True : Py_False;
    Py_INCREF(values[11]);
    PyObject *obj = new_record(d->span_type, d->span_fields, values, 12);
    if (obj == NULL) return FAILED;
    int failed = PyList_Append(spans, obj);
    Py_DECREF(obj);
    return failed ? FAILED : DONE;
fail:
    for (int i = 0; i < 12; i++) Py_XDECREF(values[i]);
    return rc;
}

/* --- resource spans and the request ----------------------------------------------------- */

static int decode_resource(Decoder *d, Reader r, PyObject **out) {
    Run run = {0};
    Reader message = r;
    while (r.p < r.end) {
        const uint8_t *tag_start = r.p;
        uint32_t field;
        int wt;
        Reader s;
        CHECK(read_tag(&r, &field, &wt));
        if (field == 1) {
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            run_add(&run, tag_start, r.p);
        } else if (field == 2) {
            EXPECT(wt, 0);
            CHECK(skip_field(&r, wt));
        } else if (field == 3) {
            EXPECT(wt, 2);
            CHECK(read_bytes(&r, &s));
            CHECK(check_shape(s, &ENTITY_REF_SHAPE));
        } else {
            CHECK(skip_field(&r, wt));
        }
    }
    return attributes(d, message, 1, &run, out);
}

static int decode_scope_spans(Decoder *d, Reader r, PyObject *resource, PyObject *spans) {
    int scope_seen = 0;
    uint32_t field;
    Reader s;
    for (;;) { /* scope = 1, spans = 2, schema_url = 3 */
        CHECK(next_field(&r, BIT(1) | BIT(2) | BIT(3), &field, &s));
        if (field == 0) return DONE;
        if (field == 1) {
            if (scope_seen++) return FALLBACK;
            CHECK(check_shape(s, &SCOPE_SHAPE));
        } else if (field == 2) {
            CHECK(decode_span(d, s, resource, spans));
        } else {
            CHECK(check_utf8(s));
        }
    }
}

static int decode_resource_spans(Decoder *d, Reader r, PyObject *spans) {
    /* resource = 1, scope_spans = 2, schema_url = 3; the resource first, wherever it is. */
    const uint32_t fields = BIT(1) | BIT(2) | BIT(3);
    Reader scan = r, resource_bytes = {r.p, r.p}, s;
    int resource_seen = 0;
    uint32_t field;
    for (;;) {
        CHECK(next_field(&scan, fields, &field, &s));
        if (field == 0) break;
        if (field == 1) {
            if (resource_seen++) return FALLBACK;
            resource_bytes = s;
        } else if (field == 3) {
            CHECK(check_utf8(s));
        }
    }
    PyObject *resource;
    CHECK(decode_resource(d, resource_bytes, &resource));
    int rc;
    for (;;) {
        if ((rc = next_field(&r, fields, &field, &s)) != DONE || field == 0) break;
        if (field == 2 && (rc = decode_scope_spans(d, s, resource, spans)) != DONE) break;
    }
    Py_DECREF(resource);
    return rc;
}

static int decode_request(Decoder *d, Reader r, PyObject *spans) {
    uint32_t field;
    Reader s;
    for (;;) { /* resource_spans = 1 */
        CHECK(next_field(&r, BIT(1), &field, &s));
        if (field == 0) return DONE;
        CHECK(decode_resource_spans(d, s, spans));
    }
}

/* --- the module ------------------------------------------------------------------------- */

PyDoc_STRVAR(decode_traces_doc,
"decode_traces(body, config) -> tuple | None\n\n"
"An OTLP ExportTraceServiceRequest (protobuf bytes) decoded under the ingest limits:\n"
"(spans, rejected_trace_id, rejected_span_id, rejected_parent_span_id,\n"
" attributes_dropped, content_attributes_dropped, values_truncated, events_dropped,\n"
" content_events_dropped), or None where the pure-Python decoder must decide.\n"
"config is the tuple otlp_decode.native_config() builds.");

static PyObject *decode_traces(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer body;
    PyObject *config;
    if (!PyArg_ParseTuple(args, "y*O!", &body, &PyTuple_Type, &config)) return NULL;
    Decoder d;
    memset(&d, 0, sizeof d);
    PyObject *span_type, *event_type, *result = NULL, *spans = NULL;
    if (!PyArg_ParseTuple(config, "nnnpO!O!O!O!O!O!O!O!;config", &d.max_attributes,
                          &d.max_value_length, &d.max_events, &d.keep_content,
                          &PyTuple_Type, &d.content_prefixes,
                          &PyFrozenSet_Type, &d.content_event_names,
                          &PyType_Type, &span_type, &PyType_Type, &event_type,
                          &PyTuple_Type, &d.span_fields, &PyTuple_Type, &d.event_fields,
                          &PyDict_Type, &d.no_attributes, &PyTuple_Type, &d.no_events)) {
        PyBuffer_Release(&body);
        return NULL;
    }
    d.span_type = (PyTypeObject *)span_type;
    d.event_type = (PyTypeObject *)event_type;
    if (PyTuple_GET_SIZE(d.span_fields) != 12 || PyTuple_GET_SIZE(d.event_fields) != 3) {
        PyErr_SetString(PyExc_ValueError, "config: 12 span fields and 3 event fields");
        PyBuffer_Release(&body);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(d.content_prefixes); i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(d.content_prefixes, i))) {
            PyErr_SetString(PyExc_TypeError, "config: content prefixes must be bytes");
            PyBuffer_Release(&body);
            return NULL;
        }
    }
    int rc = FAILED;
    if (table_init(&d.keys, 64) || table_init(&d.texts, 256) || table_init(&d.names, 64) ||
        table_init(&d.ids, 256) || table_init(&d.ints, 64) ||
        table_init(&d.attribute_sets, 256))
        goto done;
    if ((spans = PyList_New(0)) == NULL) goto done;
    Reader r = {(const uint8_t *)body.buf, (const uint8_t *)body.buf + body.len};
    rc = decode_request(&d, r, spans);
    if (rc == DONE) {
        result = Py_BuildValue("(Ollllllll)", spans, d.rejected[0], d.rejected[1],
                               d.rejected[2], d.attributes_dropped,
                               d.content_attributes_dropped, d.values_truncated,
                               d.events_dropped, d.content_events_dropped);
    } else if (rc == FALLBACK) {
        result = Py_None;
        Py_INCREF(result);
    }
done:
    last_longest_probe = 0;
    const Table *tables[] = {&d.keys, &d.texts, &d.names, &d.ids, &d.ints,
                             &d.attribute_sets};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        if (tables[i]->longest_probe > last_longest_probe)
            last_longest_probe = tables[i]->longest_probe;
    }
    Py_XDECREF(spans);
    table_free(&d.keys);
    table_free(&d.texts);
    table_free(&d.names);
    table_free(&d.ids);
    table_free(&d.ints);
    table_free(&d.attribute_sets);
    PyBuffer_Release(&body);
    return result;
}

PyDoc_STRVAR(longest_probe_doc,
"longest_probe() -> int\n\n"
"The slots the longest table lookup of the last decode_traces call in this process\n"
"looked at (1: found at once); PROBE_LIMIT + 1 where one gave up and the call returned\n"
"None. Tests read it to show that colliding input costs no more than random input.");

static PyObject *longest_probe(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return PyLong_FromSize_t(last_longest_probe);
}

static int key_halves(Py_buffer *key, uint64_t out[2]) {
    if (key->len != 16) {
        PyErr_SetString(PyExc_ValueError, "the key is 16 bytes");
        return -1;
    }
    out[0] = load_le64((const uint8_t *)key->buf);
    out[1] = load_le64((const uint8_t *)key->buf + 8);
    return 0;
}

PyDoc_STRVAR(siphash13_doc,
"_siphash13(key, data) -> int\n\n"
"The tables' hash of data under a 16-byte key, unsigned (for tests: it must agree\n"
"with CPython's own SipHash-1-3).");

static PyObject *siphash13_py(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer key, data;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &data)) return NULL;
    uint64_t k[2];
    PyObject *result = NULL;
    if (key_halves(&key, k) == 0)
        result = PyLong_FromUnsignedLongLong(
            siphash13(k[0], k[1], (const uint8_t *)data.buf, (size_t)data.len));
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    return result;
}

/* A fresh random key from os.urandom. */
static int draw_key(void) {
    PyObject *os = PyImport_ImportModule("os");
    if (os == NULL) return -1;
    PyObject *random = PyObject_CallMethod(os, "urandom", "i", 16);
    Py_DECREF(os);
    if (random == NULL) return -1;
    if (!PyBytes_Check(random) || PyBytes_GET_SIZE(random) != 16) {
        Py_DECREF(random);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom(16) did not give 16 bytes");
        return -1;
    }
    const uint8_t *bytes = (const uint8_t *)PyBytes_AS_STRING(random);
    hash_key[0] = load_le64(bytes);
    hash_key[1] = load_le64(bytes + 8);
    Py_DECREF(random);
    return 0;
}

PyDoc_STRVAR(set_hash_key_doc,
"_set_hash_key(key) -> None\n\n"
"For tests: hash with this 16-byte key from now on, or with a fresh random one where\n"
"key is None (as at import).");

static PyObject *set_hash_key(PyObject *module, PyObject *arg) {
    (void)module;
    if (arg == Py_None) {
        if (draw_key() < 0) return NULL;
        Py_RETURN_NONE;
    }
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    uint64_t k[2];
    int failed = key_halves(&key, k);
    PyBuffer_Release(&key);
    if (failed) return NULL;
    hash_key[0] = k[0];
    hash_key[1] = k[1];
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_traces", decode_traces, METH_VARARGS, decode_traces_doc},
    {"longest_probe", longest_probe, METH_NOARGS, longest_probe_doc},
    {"_siphash13", siphash13_py, METH_VARARGS, siphash13_doc},
    {"_set_hash_key", set_hash_key, METH_O, set_hash_key_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_otlp_native",
    "The compiled OTLP trace decoder (see otlp_decode.decode_trace_payload).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__otlp_native(void) {
    if (draw_key() < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddIntConstant(module, "PROBE_LIMIT", PROBE_LIMIT) < 0 ||
        PyModule_AddIntConstant(module, "MAX_TAG_BYTES", MAX_TAG_BYTES) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
