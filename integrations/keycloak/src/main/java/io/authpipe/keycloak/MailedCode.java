package io.authpipe.keycloak;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.SecureRandom;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import org.jboss.logging.Logger;
import org.keycloak.email.EmailException;
import org.keycloak.email.EmailSenderProvider;
import org.keycloak.models.KeycloakSession;
import org.keycloak.models.RealmModel;
import org.keycloak.models.SingleUseObjectProvider;
import org.keycloak.models.UserModel;
import org.keycloak.sessions.AuthenticationSessionModel;

/**
 * The step-up's e-mailed one-time code, for a user with a verified address and no second
 * factor: {@value #DIGITS} digits from {@link SecureRandom}, sent through Keycloak's own
 * {@link EmailSenderProvider} with the realm's SMTP settings, kept only as a salted SHA-256 with
 * its expiry ({@value #TTL_MS} ms) and its tries ({@value #MAX_TRIES}; then it is void).
 *
 * <p>The browser keeps it in the authentication session; the direct grant, whose every request
 * is a new authentication, in Keycloak's single-use store keyed by realm and user (a new code
 * replaces the pending one).
 */
final class MailedCode {

  static final int DIGITS = 6;
  static final int MAX_TRIES = 5;
  static final long TTL_MS = 10 * 60 * 1000L;
  private static final SecureRandom RANDOM = new SecureRandom();
  private static final Logger LOG = Logger.getLogger(MailedCode.class);
  private static final String HASH = "authpipe.mail_code.hash";
  private static final String SALT = "authpipe.mail_code.salt";
  private static final String EXPIRES = "authpipe.mail_code.expires_ms";
  private static final String TRIES = "authpipe.mail_code.tries";

  /** What a typed code was. {@code NONE}: no code pending (never sent, expired, used up). */
  enum Check { RIGHT, WRONG, USED_UP, NONE }

  /** Where the pending code lives. */
  interface Store {
    Map<String, String> load();

    void save(Map<String, String> notes);

    void clear();
  }

  private MailedCode() {}

  /** The user can be sent a code: a verified address, and the realm has an SMTP host. */
  static boolean available(RealmModel realm, UserModel user) {
    String email = user.getEmail();
    Map<String, String> smtp = realm.getSmtpConfig();
    return email != null && !email.isBlank() && user.isEmailVerified()
        && smtp != null && smtp.get("host") != null && !smtp.get("host").isBlank();
  }

  static Store browser(AuthenticationSessionModel auth) {
    return new Store() {
      @Override
      public Map<String, String> load() {
        Map<String, String> notes = new HashMap<>();
        for (String key : new String[] {HASH, SALT, EXPIRES, TRIES}) {
          String value = auth.getAuthNote(key);
          if (value != null) {
            notes.put(key, value);
          }
        }
        return notes;
      }

      @Override
      public void save(Map<String, String> notes) {
        notes.forEach(auth::setAuthNote);
      }

      @Override
      public void clear() {
        for (String key : new String[] {HASH, SALT, EXPIRES, TRIES}) {
          auth.removeAuthNote(key);
        }
      }
    };
  }

  static Store grant(KeycloakSession session, RealmModel realm, UserModel user) {
    SingleUseObjectProvider store = session.singleUseObjects();
    String key = "authpipe.mail_code." + realm.getId() + "." + user.getId();
    return new Store() {
      @Override
      public Map<String, String> load() {
        Map<String, String> notes = store.get(key);
        return notes == null ? Map.of() : notes;
      }

      @Override
      public void save(Map<String, String> notes) {
        long expires = Long.parseLong(notes.get(EXPIRES));
        long lifespanS = Math.max(1, (expires - System.currentTimeMillis() + 999) / 1000);
        store.put(key, lifespanS, notes);
      }

      @Override
      public void clear() {
        store.remove(key);
      }
    };
  }

  /** A code is pending: sent, not expired, tries left. */
  static boolean pending(Store store, long nowMs) {
    Map<String, String> notes = store.load();
    return notes.containsKey(HASH) && nowMs < parse(notes.get(EXPIRES))
        && parse(notes.get(TRIES)) < MAX_TRIES;
  }

  /**
   * Make a new code, keep its digest in {@code store} (replacing any pending one) and mail it
   * to the user. False when the mail could not be sent (logged without the address).
   */
  static boolean send(KeycloakSession session, RealmModel realm, UserModel user, Store store) {
    String code = String.format("%0" + DIGITS + "d", RANDOM.nextInt((int) Math.pow(10, DIGITS)));
    byte[] salt = new byte[16];
    RANDOM.nextBytes(salt);
    Map<String, String> notes = new HashMap<>();
    notes.put(SALT, HexFormat.of().formatHex(salt));
    notes.put(HASH, digest(salt, code));
    notes.put(EXPIRES, Long.toString(System.currentTimeMillis() + TTL_MS));
    notes.put(TRIES, "0");
    String name = realm.getDisplayName() == null || realm.getDisplayName().isBlank()
        ? realm.getName() : realm.getDisplayName();
    String text = "Your code to sign in to " + name + ": " + code + "\n\n"
        + "It is valid for " + TTL_MS / 60_000 + " minutes. If you did not just sign in, "
        + "someone else knows your password: change it.\n";
    String html = "<p>Your code to sign in to " + escape(name) + ": <b>" + code + "</b></p>"
        + "<p>It is valid for " + TTL_MS / 60_000 + " minutes. If you did not just sign in, "
        + "someone else knows your password: change it.</p>";
    try {
      session.getProvider(EmailSenderProvider.class)
          .send(realm.getSmtpConfig(), user, "Your sign-in code", text, html);
    } catch (EmailException | RuntimeException e) {
      LOG.warnf("authpipe: the step-up's code could not be mailed (realm %s): %s",
          realm.getName(), e.getMessage());
      store.clear();
      return false;
    }
    store.save(notes);
    return true;
  }

  /** Check {@code typed} against the pending code once; a right one or the last try voids it. */
  static Check check(Store store, String typed, long nowMs) {
    Map<String, String> notes = new HashMap<>(store.load());
    if (!notes.containsKey(HASH) || nowMs >= parse(notes.get(EXPIRES))) {
      store.clear();
      return Check.NONE;
    }
    int tries = (int) parse(notes.get(TRIES)) + 1;
    if (tries > MAX_TRIES) {
      store.clear();
      return Check.NONE;
    }
    byte[] salt = HexFormat.of().parseHex(notes.get(SALT));
    boolean right = typed != null && MessageDigest.isEqual(
        digest(salt, typed.trim()).getBytes(StandardCharsets.US_ASCII),
        notes.get(HASH).getBytes(StandardCharsets.US_ASCII));
    if (right) {
      store.clear();
      return Check.RIGHT;
    }
    if (tries >= MAX_TRIES) {
      store.clear();
      return Check.USED_UP;
    }
    notes.put(TRIES, Integer.toString(tries));
    store.save(notes);
    return Check.WRONG;
  }

  /** {@code alice@example.com} as {@code a***@example.com}, to say where the code went. */
  static String masked(String email) {
    int at = email == null ? -1 : email.indexOf('@');
    return at < 1 ? "your e-mail address" : email.charAt(0) + "***" + email.substring(at);
  }

  private static String digest(byte[] salt, String code) {
    try {
      MessageDigest sha = MessageDigest.getInstance("SHA-256");
      sha.update(salt);
      return HexFormat.of().formatHex(sha.digest(code.getBytes(StandardCharsets.UTF_8)));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  private static long parse(String text) {
    try {
      return text == null ? 0 : Long.parseLong(text);
    } catch (NumberFormatException e) {
      return 0;
    }
  }

  private static String escape(String s) {
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;");
  }
}
