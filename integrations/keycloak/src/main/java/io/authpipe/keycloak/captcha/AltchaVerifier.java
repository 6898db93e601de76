package io.authpipe.keycloak.captcha;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.LongSupplier;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * ALTCHA, a self-hosted proof-of-work CAPTCHA (PoW v2, the protocol of the {@code altcha} npm
 * widget 3.x and of the {@code altcha} PyPI library 2.x), with the JDK only.
 *
 * <p>{@link #newChallengeJson()} issues a challenge for the widget: {@code PBKDF2/SHA-256} with
 * {@code cost} iterations, a derived key that must start with {@code keyPrefix} ("00": one try in
 * 256 succeeds), a random nonce and salt, {@code expiresAt} (epoch seconds), and an HMAC-SHA-256
 * signature over the parameters' canonical JSON (JavaScript's {@code JSON.stringify} with sorted
 * keys). {@link #check(String)} verifies the widget's payload (base64 of {@code {"challenge":
 * {"parameters", "signature"}, "solution": {"counter", "derivedKey"}}}): the expiry, the
 * signature, the work (one key derivation), and that the challenge was not accepted before
 * (single use, remembered until it expires). It answers {@code "ok"} or the reason: {@code
 * malformed}, {@code expired}, {@code bad_signature}, {@code bad_solution}, {@code replayed};
 * exactly as the example login service's Python verifier does for the shared test vectors
 * ({@code tests/vectors/altcha.json}).
 *
 * <p>A solved challenge is a cost paid, bound to no account or address: a bot with CPU, or a
 * solving farm, pays it too (docs/policy.md). Thread-safe; never throws for a client's input.
 */
public final class AltchaVerifier implements CaptchaVerifier {

  public static final String ALGORITHM = "PBKDF2/SHA-256";
  public static final int DEFAULT_COST = 5_000;
  public static final String DEFAULT_KEY_PREFIX = "00";
  public static final long DEFAULT_TTL_SECONDS = 600;
  public static final int MIN_KEY_BYTES = 32;
  public static final int MAX_PAYLOAD_CHARS = 4_096;
  public static final int DEFAULT_MAX_ENTRIES = 100_000;
  private static final int KEY_LENGTH = 32;
  private static final int MAX_DEPTH = 512;
  private static final BigInteger MAX_SAFE = BigInteger.valueOf(1L << 53);
  private static final HexFormat HEX = HexFormat.of();

  private final byte[] key;
  private final int cost;
  private final String keyPrefix;
  private final long ttlSeconds;
  private final LongSupplier nowMillis;
  private final int maxEntries;
  private final SecureRandom random = new SecureRandom();
  /** Signatures of the challenges accepted, with their expiry (epoch s), oldest first. */
  private final LinkedHashMap<String, Long> used = new LinkedHashMap<>();

  /** The defaults: {@code PBKDF2/SHA-256}, cost 5,000, prefix "00", 10 minutes, wall clock. */
  public AltchaVerifier(String hmacKey) {
    this(
        hmacKey,
        DEFAULT_COST,
        DEFAULT_KEY_PREFIX,
        DEFAULT_TTL_SECONDS,
        System::currentTimeMillis,
        DEFAULT_MAX_ENTRIES);
  }

  public AltchaVerifier(
      String hmacKey,
      int cost,
      String keyPrefix,
      long ttlSeconds,
      LongSupplier nowMillis,
      int maxEntries) {
    this.key = checkedKey(hmacKey);
    if (cost < 1 || ttlSeconds < 1 || maxEntries < 1) {
      throw new IllegalArgumentException("ALTCHA cost, ttl and max entries must be positive");
    }
    if (keyPrefix == null || !keyPrefix.matches("[0-9a-f]{0,64}")) {
      throw new IllegalArgumentException("ALTCHA key prefix must be lower-case hex: " + keyPrefix);
    }
    this.cost = cost;
    this.keyPrefix = keyPrefix;
    this.ttlSeconds = ttlSeconds;
    this.nowMillis = nowMillis;
    this.maxEntries = maxEntries;
  }

  /** The variable the example login service reads its key from too. */
  public static final String KEY_ENV = "AUTHPIPE_ALTCHA_HMAC_KEY";

  /** A verifier with the defaults and the key in {@link #KEY_ENV} (checked as below). */
  public static AltchaVerifier fromEnvironment() {
    return new AltchaVerifier(System.getenv(KEY_ENV));
  }

  /**
   * The key's UTF-8 bytes; an {@link IllegalArgumentException} saying what to do when it is
   * missing or shorter than {@link #MIN_KEY_BYTES}.
   */
  public static byte[] checkedKey(String hmacKey) {
    if (hmacKey == null || hmacKey.isEmpty()) {
      throw new IllegalArgumentException(
          "the ALTCHA HMAC key is not set: the provider signs its CAPTCHA challenges with it; set"
              + " it to a random secret of at least "
              + MIN_KEY_BYTES
              + " bytes, the same on every Keycloak node (e.g. openssl rand -base64 32)");
    }
    byte[] bytes = hmacKey.getBytes(StandardCharsets.UTF_8);
    if (bytes.length < MIN_KEY_BYTES) {
      throw new IllegalArgumentException(
          "the ALTCHA HMAC key is "
              + bytes.length
              + " bytes: a key that short can be guessed and challenges forged; use at least "
              + MIN_KEY_BYTES
              + " random bytes (e.g. openssl rand -base64 32)");
    }
    return bytes;
  }

  /** A new signed challenge, as the widget's {@code challenge} attribute takes it. */
  public String newChallengeJson() {
    byte[] nonce = new byte[16];
    byte[] salt = new byte[16];
    random.nextBytes(nonce);
    random.nextBytes(salt);
    Map<String, Object> parameters = new LinkedHashMap<>();
    parameters.put("algorithm", ALGORITHM);
    parameters.put("cost", BigInteger.valueOf(cost));
    parameters.put("keyLength", BigInteger.valueOf(KEY_LENGTH));
    parameters.put("keyPrefix", keyPrefix);
    parameters.put("nonce", HEX.formatHex(nonce));
    parameters.put("salt", HEX.formatHex(salt));
    parameters.put("expiresAt", BigInteger.valueOf(nowMillis.getAsLong() / 1000 + ttlSeconds));
    String canonical = canonical(parameters, true);
    return "{\"parameters\":" + canonical + ",\"signature\":\"" + sign(canonical) + "\"}";
  }

  @Override
  public boolean verify(String payload) {
    return "ok".equals(check(payload));
  }

  /** {@code "ok"} once per solved challenge, else why the payload is refused. */
  public String check(String payload) {
    Map<String, Object> challenge;
    Map<String, Object> parameters;
    Map<String, Object> solution;
    try {
      Map<String, Object> data = object(parse(payload));
      challenge = object(data.get("challenge"));
      parameters = object(challenge.get("parameters"));
      solution = object(data.get("solution"));
      for (String required : new String[] {"algorithm", "nonce", "salt", "cost"}) {
        require(parameters.containsKey(required));
      }
      require(solution.containsKey("counter") && solution.containsKey("derivedKey"));
      require(parameters.get("expiresAt") instanceof BigInteger);
    } catch (IllegalArgumentException | StackOverflowError e) {
      return "malformed";
    }
    long now = nowMillis.getAsLong();
    BigInteger expires = (BigInteger) parameters.get("expiresAt");
    if (expires.multiply(BigInteger.valueOf(1000)).compareTo(BigInteger.valueOf(now)) <= 0) {
      return "expired";
    }
    Object signature = challenge.get("signature");
    String expected;
    try {
      expected = sign(canonical(signed(parameters), true));
    } catch (IllegalArgumentException e) {
      return "bad_signature"; // a value this side never signs (a fraction, a huge number)
    }
    if (!(signature instanceof String given)
        || given.isEmpty()
        || !MessageDigest.isEqual(
            given.getBytes(StandardCharsets.UTF_8), expected.getBytes(StandardCharsets.UTF_8))) {
      return "bad_signature";
    }
    String verdict;
    try {
      verdict = work(parameters, solution);
    } catch (IllegalArgumentException | ArithmeticException e) {
      return "malformed"; // signed with our key, so not a client's making
    }
    return "ok".equals(verdict) ? firstUse((String) signature, expires.longValue(), now) : verdict;
  }

  private synchronized String firstUse(String signature, long expires, long now) {
    Iterator<Map.Entry<String, Long>> oldest = used.entrySet().iterator();
    while (oldest.hasNext()) {
      if (oldest.next().getValue() * 1000 > now) {
        break;
      }
      oldest.remove();
    }
    if (used.containsKey(signature)) {
      return "replayed";
    }
    used.put(signature, expires);
    while (used.size() > maxEntries) {
      oldest = used.entrySet().iterator();
      oldest.next();
      oldest.remove();
    }
    return "ok";
  }

  private static String work(Map<String, Object> parameters, Map<String, Object> solution) {
    if (!(solution.get("counter") instanceof BigInteger counter)
        || counter.signum() < 0
        || counter.bitLength() > 32) {
      return "bad_solution";
    }
    String algorithm = text(parameters.get("algorithm"));
    int iterations = integer(parameters.get("cost"));
    Object length = parameters.containsKey("keyLength") ? parameters.get("keyLength") : 32;
    int keyLength = length instanceof Integer i ? i : integer(length);
    Object prefix = parameters.containsKey("keyPrefix") ? parameters.get("keyPrefix") : "00";
    byte[] nonce = HEX.parseHex(text(parameters.get("nonce")));
    byte[] salt = HEX.parseHex(text(parameters.get("salt")));
    byte[] password = ByteBuffer.allocate(nonce.length + 4).put(nonce).putInt(counter.intValue()).array();
    String derived = HEX.formatHex(derive(algorithm, iterations, keyLength, salt, password));
    boolean matches =
        solution.get("derivedKey") instanceof String given
            && MessageDigest.isEqual(
                derived.getBytes(StandardCharsets.UTF_8), given.getBytes(StandardCharsets.UTF_8));
    return matches && derived.startsWith(text(prefix).toLowerCase(Locale.ROOT)) ? "ok" : "bad_solution";
  }

  /** The key derivation of {@code algorithm}: PBKDF2-HMAC, or iterated SHA (PoW v2). */
  static byte[] derive(String algorithm, int cost, int keyLength, byte[] salt, byte[] password) {
    String upper = algorithm.toUpperCase(Locale.ROOT);
    if (upper.equals("SCRYPT") || upper.equals("ARGON2ID")) {
      throw new IllegalArgumentException("unsupported ALTCHA algorithm " + algorithm);
    }
    if (upper.startsWith("PBKDF2")) {
      String mac =
          switch (algorithm) {
            case "PBKDF2/SHA-512" -> "HmacSHA512";
            case "PBKDF2/SHA-384" -> "HmacSHA384";
            default -> "HmacSHA256";
          };
      return pbkdf2(mac, password, salt, cost, keyLength);
    }
    String digest =
        switch (algorithm) {
          case "SHA-512" -> "SHA-512";
          case "SHA-384" -> "SHA-384";
          default -> "SHA-256";
        };
    try {
      MessageDigest sha = MessageDigest.getInstance(digest);
      byte[] data = concat(salt, password);
      for (int i = 0; i < Math.max(1, cost); i++) {
        data = sha.digest(data);
      }
      return java.util.Arrays.copyOf(data, Math.min(keyLength, data.length));
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException(e);
    }
  }

  /** PBKDF2 (RFC 8018) over raw bytes: the JDK's PBEKeySpec takes only a char[] password. */
  private static byte[] pbkdf2(String mac, byte[] password, byte[] salt, int cost, int length) {
    if (cost < 1 || length < 1) {
      throw new IllegalArgumentException("bad PBKDF2 cost or length");
    }
    try {
      Mac hmac = Mac.getInstance(mac);
      hmac.init(new SecretKeySpec(password, mac)); // nonce + counter: never empty
      byte[] out = new byte[length];
      int blockLength = hmac.getMacLength();
      for (int block = 1, done = 0; done < length; block++, done += blockLength) {
        hmac.update(salt);
        byte[] u = hmac.doFinal(ByteBuffer.allocate(4).putInt(block).array());
        byte[] t = u.clone();
        for (int i = 1; i < cost; i++) {
          u = hmac.doFinal(u);
          for (int j = 0; j < t.length; j++) {
            t[j] ^= u[j];
          }
        }
        System.arraycopy(t, 0, out, done, Math.min(blockLength, length - done));
      }
      return out;
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException(e);
    }
  }

  private String sign(String canonical) {
    try {
      Mac hmac = Mac.getInstance("HmacSHA256");
      hmac.init(new SecretKeySpec(key, "HmacSHA256"));
      return HEX.formatHex(hmac.doFinal(canonical.getBytes(StandardCharsets.UTF_8)));
    } catch (GeneralSecurityException e) {
      throw new IllegalStateException(e);
    }
  }

  /**
   * The parameters as ALTCHA's libraries sign them: the known keys only, {@code keyLength} and
   * {@code keyPrefix} defaulted when absent, the optional ones when present (null included).
   */
  private static Map<String, Object> signed(Map<String, Object> parameters) {
    Map<String, Object> out = new LinkedHashMap<>();
    for (String name : new String[] {"algorithm", "cost", "nonce", "salt"}) {
      out.put(name, parameters.get(name));
    }
    out.put("keyLength", parameters.containsKey("keyLength") ? parameters.get("keyLength") : BigInteger.valueOf(32));
    out.put("keyPrefix", parameters.containsKey("keyPrefix") ? parameters.get("keyPrefix") : "00");
    for (String name : new String[] {"keySignature", "memoryCost", "parallelism", "expiresAt", "data"}) {
      if (parameters.containsKey(name)) {
        out.put(name, parameters.get(name));
      }
    }
    return out;
  }

  // -- canonical JSON: JavaScript's JSON.stringify, object keys sorted (not inside arrays) --

  static String canonical(Object value, boolean sort) {
    StringBuilder out = new StringBuilder();
    write(out, value, sort);
    return out.toString();
  }

  @SuppressWarnings("unchecked")
  private static void write(StringBuilder out, Object value, boolean sort) {
    if (value == null) {
      out.append("null");
    } else if (value instanceof Boolean b) {
      out.append(b);
    } else if (value instanceof String s) {
      quote(out, s);
    } else if (value instanceof BigInteger n) {
      require(n.abs().compareTo(MAX_SAFE) <= 0);
      out.append(n);
    } else if (value instanceof BigDecimal d) {
      // JavaScript prints 5000.0 as 5000; a fraction, or a number past 2^53 (whose digits
      // JavaScript rounds), is never signed here. Checked before any exact conversion, which
      // 1e999999999 would make expensive.
      BigDecimal stripped = d.stripTrailingZeros();
      require(stripped.scale() <= 0 && stripped.precision() - stripped.scale() <= 16);
      write(out, stripped.toBigIntegerExact(), sort);
    } else if (value instanceof Integer n) {
      out.append(n);
    } else if (value instanceof Double) {
      throw new IllegalArgumentException("NaN and Infinity are never signed here");
    } else if (value instanceof List<?> list) {
      out.append('[');
      for (int i = 0; i < list.size(); i++) {
        if (i > 0) {
          out.append(',');
        }
        write(out, list.get(i), false);
      }
      out.append(']');
    } else {
      Map<String, Object> map = (Map<String, Object>) value;
      TreeMap<Long, String> indices = new TreeMap<>();
      List<String> others = new ArrayList<>();
      for (String k : map.keySet()) {
        if (k.matches("0|[1-9][0-9]{0,9}") && Long.parseLong(k) <= 4_294_967_294L) {
          indices.put(Long.parseLong(k), k);
        } else {
          others.add(k);
        }
      }
      if (sort) {
        require(!map.containsKey("__proto__"));
        others.sort(null); // String order is UTF-16 code unit order, as JavaScript's
      }
      List<String> keys = new ArrayList<>(indices.values());
      keys.addAll(others);
      out.append('{');
      for (int i = 0; i < keys.size(); i++) {
        if (i > 0) {
          out.append(',');
        }
        quote(out, keys.get(i));
        out.append(':');
        write(out, map.get(keys.get(i)), sort);
      }
      out.append('}');
    }
  }

  private static void quote(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          boolean paired =
              Character.isHighSurrogate(c)
                  && i + 1 < s.length()
                  && Character.isLowSurrogate(s.charAt(i + 1));
          if (paired) {
            out.append(c).append(s.charAt(++i));
          } else if (c < 0x20 || Character.isSurrogate(c)) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
        }
      }
    }
    out.append('"');
  }

  // -- the payload: base64 of JSON, read by a small strict parser (no dependency) ----------

  private static Object parse(String payload) {
    require(payload != null && !payload.isEmpty() && payload.length() <= MAX_PAYLOAD_CHARS);
    require(payload.length() % 4 == 0); // the JDK's decoder would take missing padding
    byte[] raw = Base64.getDecoder().decode(payload);
    String text;
    try {
      text =
          StandardCharsets.UTF_8
              .newDecoder()
              .onMalformedInput(CodingErrorAction.REPORT)
              .onUnmappableCharacter(CodingErrorAction.REPORT)
              .decode(ByteBuffer.wrap(raw))
              .toString();
    } catch (CharacterCodingException e) {
      throw new IllegalArgumentException("not UTF-8");
    }
    Json json = new Json(text);
    Object value = json.value(0);
    json.skipSpace();
    require(json.at == text.length());
    return value;
  }

  private static final class Json {
    private final String s;
    private int at;

    Json(String s) {
      this.s = s;
    }

    void skipSpace() {
      while (at < s.length() && " \t\n\r".indexOf(s.charAt(at)) >= 0) {
        at++;
      }
    }

    Object value(int depth) {
      require(depth <= MAX_DEPTH);
      skipSpace();
      require(at < s.length());
      char c = s.charAt(at);
      if (c == '{') {
        at++;
        Map<String, Object> map = new LinkedHashMap<>();
        skipSpace();
        if (peek('}')) {
          return map;
        }
        do {
          skipSpace();
          require(at < s.length() && s.charAt(at) == '"');
          String k = string();
          skipSpace();
          require(peek(':'));
          map.put(k, value(depth + 1));
          skipSpace();
        } while (peek(','));
        require(peek('}'));
        return map;
      }
      if (c == '[') {
        at++;
        List<Object> list = new ArrayList<>();
        skipSpace();
        if (peek(']')) {
          return list;
        }
        do {
          list.add(value(depth + 1));
          skipSpace();
        } while (peek(','));
        require(peek(']'));
        return list;
      }
      if (c == '"') {
        return string();
      }
      for (String word : new String[] {"true", "false", "null"}) {
        if (s.startsWith(word, at)) {
          at += word.length();
          return word.equals("null") ? null : Boolean.valueOf(word);
        }
      }
      for (String word : new String[] {"NaN", "Infinity", "-Infinity"}) {
        if (s.startsWith(word, at)) { // Python's json reads them too
          at += word.length();
          return Double.NaN;
        }
      }
      return number();
    }

    private boolean peek(char c) {
      if (at < s.length() && s.charAt(at) == c) {
        at++;
        return true;
      }
      return false;
    }

    private String string() {
      at++; // the opening quote
      StringBuilder out = new StringBuilder();
      while (true) {
        require(at < s.length());
        char c = s.charAt(at++);
        if (c == '"') {
          return out.toString();
        }
        require(c >= 0x20);
        if (c != '\\') {
          out.append(c);
          continue;
        }
        require(at < s.length());
        char e = s.charAt(at++);
        switch (e) {
          case '"', '\\', '/' -> out.append(e);
          case 'b' -> out.append('\b');
          case 'f' -> out.append('\f');
          case 'n' -> out.append('\n');
          case 'r' -> out.append('\r');
          case 't' -> out.append('\t');
          case 'u' -> {
            require(at + 4 <= s.length() && s.substring(at, at + 4).matches("[0-9a-fA-F]{4}"));
            out.append((char) Integer.parseInt(s.substring(at, at + 4), 16));
            at += 4;
          }
          default -> throw new IllegalArgumentException("bad escape");
        }
      }
    }

    private Object number() {
      int start = at;
      peek('-');
      require(at < s.length());
      if (!peek('0')) {
        require(Character.isDigit(s.charAt(at)));
        digits();
      }
      boolean integer = true;
      if (peek('.')) {
        integer = false;
        require(at < s.length() && Character.isDigit(s.charAt(at)));
        digits();
      }
      if (at < s.length() && (s.charAt(at) == 'e' || s.charAt(at) == 'E')) {
        integer = false;
        at++;
        if (!peek('+')) {
          peek('-');
        }
        require(at < s.length() && Character.isDigit(s.charAt(at)));
        digits();
      }
      String lexeme = s.substring(start, at);
      require(lexeme.length() <= 400);
      return integer ? new BigInteger(lexeme) : new BigDecimal(lexeme);
    }

    private void digits() {
      while (at < s.length() && s.charAt(at) >= '0' && s.charAt(at) <= '9') {
        at++;
      }
    }
  }

  @SuppressWarnings("unchecked")
  private static Map<String, Object> object(Object value) {
    require(value instanceof Map);
    return (Map<String, Object>) value;
  }

  private static String text(Object value) {
    require(value instanceof String);
    return (String) value;
  }

  private static int integer(Object value) {
    require(value instanceof BigInteger);
    return ((BigInteger) value).intValueExact();
  }

  private static byte[] concat(byte[] a, byte[] b) {
    byte[] out = java.util.Arrays.copyOf(a, a.length + b.length);
    System.arraycopy(b, 0, out, a.length, b.length);
    return out;
  }

  private static void require(boolean condition) {
    if (!condition) {
      throw new IllegalArgumentException("not an ALTCHA payload");
    }
  }
}
